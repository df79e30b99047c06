"""What a result whose streams echoed a secret may still say of the bytes received.

docs/redaction.md, "What was received": where redaction replaced something in a stream, the
size and hash of the bytes received would give the secret away -- its length by subtraction
(the caller reads the redacted stream beside it), its value by hashing guesses offline.
``REMOTE_RESPONSE_COMPLETE`` withholds them (``delivery.received_evidence``).  They were
still in two other places a caller reads:

* the protocol summary (PROTOCOL_OBSERVED, the record's ``evidence.<protocol>``): the
  driver's byte counts -- HTTP's ``body_bytes``, ``total``, ``response_bytes``, SSH's
  ``stdout_bytes`` -- facts recorded as the bytes arrived; and the path's step counts
  (``engine/steps.py``): every body piece or output chunk is a step, so a body sent as 1-byte
  chunks makes its run's count in ``path_repeats`` its size, and ``path_left_out``'s runs and
  steps count chunks the same way (what ``len(path)`` was before the path was encoded), and
  with SSH's stdout and stderr alternating every chunk is a run of its own, so the number of
  runs, and whether some were left out, counted them too (``_folded_path``);
* the result's headers: the remote's own ``Content-Length``, ``Content-Range`` and the
  headers that digest the body (``Digest``, ``Content-Digest``, ``Repr-Digest``,
  ``Content-MD5``, an ``ETag``, which servers commonly make a hash of the content).

An attempt cut short records the driver's facts (ATTEMPT_INTERRUPTED): SSH's hold each stream's
SHA-256 of the bytes received besides its count -- an echoed stream's goes too.  One cut at
``max_result`` records ``result_size_limit`` (the limit, the bytes received, the bytes decoded:
the record's ``evidence.result_size_limit``, the event's attr and message, the protocol
summary's copy): where the rest goes, it keeps only ``limit`` and says ``received_withheld``.
The piece that crossed the limit is in that count, so the sink scans it before it raises
(``StreamSink._scan``), and a compressed body stopped there was not decoded whole
(``unscanned``: ``decoding._cut_unscanned``).

``without_received_size`` drops them from the protocol summary and ``without_size_headers``
from the result's headers once the sink has finished and knows which streams it redacted
(``delivery._commit``, ``StreamSink.redacted``).  An attempt that ends without a result drops
them too (``attempt.observed_events``, and ``without_received_counts`` from ATTEMPT_INTERRUPTED's
facts) where redaction replaced something, or would in the bytes it still held back when the
answer was cut (``StreamSink.redacted_streams``: what ``finish`` would flush, scanned as
``sub`` scans it -- the same streams ``redacted`` would name), and where a stream was not
scanned whole (``StreamSink.withheld``: HTTP's decoding reports a ``br``, corrupt or bomb body
through ``AttemptContext.withhold`` as soon as it knows, so a body cut off by a stall or a close
is not measured either).  ``received_withheld: "redacted"`` (or ``"unscanned"``) says that they
were dropped: made null, not left out, and the summary says ``received_withheld`` (null) when
nothing was -- the record merges a retry's summary over the last one's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from affidavit.statemachine import Event, EventKind

__all__ = [
    "stronger",
    "without_received_counts",
    "without_received_size",
    "without_size_headers",
]

_STRENGTH: Final = {
    None: 0,
    "tail_redacted": 1,
    "short_redacted": 2,
    "redacted": 3,
    "unscanned": 4,
}
"""The reasons for withholding, weakest first: ``tail_redacted`` (the answer was cut short and
its last bytes withheld, whatever they were: ``Redactor.flush``), ``short_redacted`` (only whole
forms of a value under 8 bytes were replaced -- a short password's digits in a date: it may be
ordinary text), ``redacted`` (an echo was proven), ``unscanned`` (no scan saw all of it: anything
may be in it)."""


def stronger(*reasons: Any) -> Any:
    """The strongest of ``reasons`` (``_STRENGTH``): two sayers of why the counts went -- the
    driver's head (HTTP's ``progress``), the sink's streams -- combine without one lowering
    the other's word (a head that echoed the whole credential, a body that only ends inside
    it: the record says ``redacted``, never the weaker ``tail_redacted``)."""
    return max(reasons, key=lambda r: _STRENGTH.get(r, 0))


_COUNTS: Final = frozenset(
    {"bytes", "total", "body_bytes", "response_bytes", "received_bytes", "decoded_bytes"}
)
"""The drivers' facts that count received bytes (besides ``<stream>_bytes``)."""
_SIZE_HEADERS: Final = frozenset(
    {
        "content-length",
        "content-range",
        "digest",
        "content-digest",
        "repr-digest",
        "content-md5",
        "etag",
    }
)
"""Response headers that measure or digest the body (RFC 9110 §8.6, §14.4, §8.8.3; RFC 9530)."""


def without_received_counts(
    facts: Mapping[str, Any], redacted: Iterable[str], reason: str = "redacted"
) -> dict[str, Any]:
    """``facts`` (a driver's, top level) without the received byte counts, if any stream in
    ``redacted`` had a secret replaced (or was not scanned whole: ``reason`` "unscanned"), nor
    that stream's ``<stream>_sha256`` (SSH's ``result_facts`` hash the bytes received, before
    redaction: a guess of the secret would be checked against it offline), nor the path's
    step counts (``path_repeats``' and ``path_left_out``'s, made null: every run's -- which
    run counts a stream's chunks is the protocol's to know, not this function's), nor its
    runs of the stream's chunks (``_folded_path``);
    ``received_withheld`` then says so: ``reason`` or, if stronger, the word already there
    (``stronger``)."""
    streams = set(redacted)
    if not streams:
        return dict(facts)
    counts = _COUNTS | {f"{name}_{what}" for name in streams for what in ("bytes", "sha256")}
    # Null, not absent: the record's ``evidence.<protocol>`` merges each summary's facts over
    # the last one's (``rules_attempt._on_observed``), so a key left out would show an earlier
    # attempt's count beside this attempt's path.
    kept: dict[str, Any] = {k: v for k, v in facts.items() if k not in counts}
    kept.update(dict.fromkeys(sorted(counts)))
    over = kept.get("result_size_limit")
    if isinstance(over, Mapping):
        reason = stronger(reason, over.get("received_withheld"))
    # The driver may have said already (HTTP's ``progress``: the head echoed): never lowered.
    reason = kept["received_withheld"] = stronger(reason, facts.get("received_withheld"))
    kept.update(_folded_path(kept, streams))
    if isinstance(over, Mapping):  # the bytes received when the limit stopped the attempt
        kept["result_size_limit"] = {"limit": over.get("limit"), "received_withheld": reason}
    return kept


_GAP: Final = ""
"""The place of what ``path_left_out`` counts among the runs (no state is named "")."""


def _folded_path(facts: Mapping[str, Any], streams: set[str]) -> dict[str, Any]:
    """The step path (``engine/steps.py``) without what counts the withheld streams' chunks:
    every count is null (which runs repeated stays), and each block of runs of those streams'
    states -- with the states interleaved with them (SSH's stderr between stdout chunks) and
    what was left out there, if it was only those states -- lists each of its states once, in
    the order they first came.  Alternating every chunk, the number of runs was the number of
    chunks, and so was whether any were left out (past 64 runs): no longer.  (A state seen
    only among those left out is listed without a repeat: it came once at least.)"""
    path, repeats, left = facts.get("path"), facts.get("path_repeats"), facts.get("path_left_out")
    if not isinstance(path, list) or not isinstance(repeats, list):
        return {}
    many = {run[0] for run in repeats if isinstance(run, list) and run}
    runs = [(state, i in many) for i, state in enumerate(path)]  # (state, more than one step)
    gap: frozenset[str] = frozenset()  # what was left out: its states
    at = left.get("after") if isinstance(left, Mapping) else None
    if type(at) is int and 0 <= at <= len(runs):
        assert isinstance(left, Mapping)
        states = left.get("states")
        gap = frozenset({_GAP})  # its states unknown: never folded
        if isinstance(states, list) and all(isinstance(x, str) and x for x in states):
            gap = frozenset(states)
        runs.insert(at, (_GAP, True))
    between = {
        state
        for (before, _), (state, _), (after, _) in zip(runs, runs[1:], runs[2:], strict=False)
        if before in streams and after in streams and state not in streams and state != _GAP
    }
    fold = streams | between
    out: list[tuple[str, bool]] = []
    block: dict[str, bool] = {}  # a block's states in the order they came: more than one step
    for state, more in [*runs, (None, False)]:
        if state == _GAP and gap <= fold:
            block.update({name: name in block for name in gap})  # a step at least: one more?
            continue
        if state is not None and state in fold:
            block[state] = state in block or more
            continue
        out.extend(block.items())
        block = {}
        if state is not None:
            out.append((state, more))
    left_at = next((i for i, (state, _) in enumerate(out) if state == _GAP), None)
    left_states = None if _GAP in gap else sorted(gap)  # None: the facts did not name them
    kept = [(state, more) for state, more in out if state != _GAP]
    return {
        "path": [state for state, _ in kept],
        "path_repeats": [[i, None] for i, (_, more) in enumerate(kept) if more],
        "path_left_out": None
        if left_at is None
        else {"after": left_at, "runs": None, "steps": None, "states": left_states},
    }


def without_received_size(
    observed: Iterable[tuple[Event, None]], redacted: Iterable[str], reason: str = "redacted"
) -> list[tuple[Event, None]]:
    """``observed`` (the attempt's milestones and protocol summary) without the received byte
    counts, if any stream in ``redacted`` had a secret replaced (or, ``reason`` "unscanned",
    was not scanned whole).  The summary always says ``received_withheld`` -- null when
    nothing was withheld -- so that a retry's summary, merged over an earlier attempt's in the
    record, never shows the earlier one's word beside its own counts."""
    streams = set(redacted)
    out: list[tuple[Event, None]] = []
    for event, payload in observed:
        facts = event.attrs.get("facts")
        # ``type is dict`` first: the Mapping ABC check alone would run on every call's path.
        if event.kind is EventKind.PROTOCOL_OBSERVED and (
            type(facts) is dict or isinstance(facts, Mapping)
        ):
            if streams:
                kept = without_received_counts(facts, streams, reason)
            elif "received_withheld" in facts:
                # Already said (``observed_events`` always does; the driver's own word, HTTP's
                # ``progress``, stands): no copy of every call's summary.
                out.append((event, payload))
                continue
            else:
                kept = {"received_withheld": None, **facts}
            event = replace(event, attrs={**event.attrs, "facts": kept})
        out.append((event, payload))
    return out


def without_size_headers(summary: Mapping[str, Any], redacted: bool) -> Mapping[str, Any]:
    """The result ``summary`` without the headers that measure or digest its body, if
    ``redacted`` (a secret was replaced in a stream of the result, or one was not scanned
    whole)."""
    headers = summary.get("headers")
    if not redacted or not isinstance(headers, list):
        return summary
    kept = [
        h
        for h in headers
        if not (isinstance(h, list | tuple) and h and str(h[0]).lower() in _SIZE_HEADERS)
    ]
    return {**summary, "headers": kept}
