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
    ]
    env = render_envelope(project(events))
    assert env["error"]["retry"] == "backoff"
    assert env["evidence"]["retry_after"] == 7.0
    # Without a Retry-After there is no such field (absence is not zero).
    events[-1] = Event(
        E.REMOTE_RESPONSE_COMPLETE,
        "a",
        {"outcome": "rejected", "code": "REMOTE_THROTTLED", "status": 429},
        source=EvidenceSource.REMOTE_RESPONSE,
        seq=5,
    )
    assert "retry_after" not in render_envelope(project(events))["evidence"]
