"""The envelope carries Retry-After as evidence, so automation waits as long as the remote
asked — without parsing the message."""

from affidavit.statemachine import Event, EventKind, EvidenceSource, project, render_envelope

E = EventKind
OP = {"target": "t", "protocol": "http", "idempotent": True, "fingerprint": "sha256:x"}


def test_throttled_envelope_carries_retry_after() -> None:
    events = [
        Event(E.ACTION_ACCEPTED, "a", {"operation": OP}, seq=1),
        Event(E.PREFLIGHT_VALIDATED, "a", {}, seq=2),
        Event(E.CREDENTIAL_AUTHORIZED, "a", {}, seq=3),
        Event(E.DISPATCH_STARTED, "a", {"generation": 0}, seq=4),
        Event(
            E.REMOTE_RESPONSE_COMPLETE,
            "a",
            {"outcome": "rejected", "code": "REMOTE_THROTTLED", "status": 429, "retry_after": 7},
            source=EvidenceSource.REMOTE_RESPONSE,
            seq=5,
        ),
        Event(E.RESULT_COMMITTED, "a", {"sha256": "sha256:00"}, seq=6),
    ]
    env = render_envelope(project(events, None))
    assert env["error"]["retry"] == "backoff"
    assert env["evidence"]["retry_after"] == 7.0
    # Without a Retry-After there is no such field (absence is not zero).
    events[-2] = Event(
        E.REMOTE_RESPONSE_COMPLETE,
        "a",
        {"outcome": "rejected", "code": "REMOTE_THROTTLED", "status": 429},
        source=EvidenceSource.REMOTE_RESPONSE,
        seq=5,
    )
    env = render_envelope(project(events, None))
    assert "retry_after" not in env["evidence"]
    # Seed: backoff only if "the response specifies a suitable time"; without one the caller
    # must look before sending again, even for an idempotent method.
    assert (env["error"]["outcome"], env["error"]["retry"]) == ("rejected", "reconcile")


def test_an_unfinished_record_is_in_progress_never_a_bare_success() -> None:
    """A record stopped at DISPATCH_STARTED (running elsewhere, or its broker was killed) has no
    result: rendering it must not read as success (no error) nor invite a re-send."""
    events = [
        Event(E.ACTION_ACCEPTED, "a", {"operation": OP}, seq=1),
        Event(E.PREFLIGHT_VALIDATED, "a", {}, seq=2),
        Event(E.CREDENTIAL_AUTHORIZED, "a", {}, seq=3),
        Event(E.DISPATCH_STARTED, "a", {"generation": 0}, seq=4),
    ]
    env = render_envelope(project(events, None))
    assert env["error"]["code"] == "IN_PROGRESS"
    assert (env["error"]["outcome"], env["error"]["retry"]) == ("unknown", "fetch_result")
    assert env["evidence"]["dispatch_started"] is True
    assert env.get("result") is None
    # Before dispatch the same holds, with the outcome the record proves.
    env = render_envelope(project(events[:3], None))
    assert (env["error"]["code"], env["error"]["outcome"]) == ("IN_PROGRESS", "not_attempted")


def test_evidence_idempotent_is_only_what_action_accepted_says() -> None:
    """``evidence.idempotent`` is ACTION_ACCEPTED's ``operation.idempotent``: shown true or
    false as recorded, and left out of a record whose operation does not say (one accepted
    before the field was recorded) -- never a false the records do not back."""
    tail = [
        Event(E.PREFLIGHT_VALIDATED, "a", {}, seq=2),
        Event(E.CREDENTIAL_AUTHORIZED, "a", {}, seq=3),
        Event(E.DISPATCH_STARTED, "a", {"generation": 0}, seq=4),
    ]
    for said in (True, False):
        op = {**OP, "idempotent": said}
        events = [Event(E.ACTION_ACCEPTED, "a", {"operation": op}, seq=1), *tail]
        assert render_envelope(project(events, None))["evidence"]["idempotent"] is said
    unsaid = {k: v for k, v in OP.items() if k != "idempotent"}
    events = [Event(E.ACTION_ACCEPTED, "a", {"operation": unsaid}, seq=1), *tail]
    env = render_envelope(project(events, None))
    assert "idempotent" not in env["evidence"]
    assert env["error"]["code"] == "IN_PROGRESS"  # the record itself reads as before
