"""The rules of an attempt past its dispatch gate: the dispatch itself, what was sent and
received, the complete result or the interruption, and the result's storage and delivery; also
``PROTOCOL_OBSERVED``, the protocol machine's steps an attempt records along the way.  Every
event here names its attempt's generation and is refused when that is not the current one
(``_stale``, inline: see its docstring for why no wrapper).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from .contract import CODES, Code
from .events import Event
from .rules_common import (
    _CLOSED,
    _CODE_BY_VALUE,
    _COMMITTED,
    _DELIVERY_FAILED,
    _FENCED,
    _REMOTE_EXECUTION,
    _REMOTE_RESPONSE,
    _RESOLVED_BY_VALUE,
    _SOURCE,
    _STORE_FAILED,
    _UNKNOWN,
    _closed,
    _code_of,
    _is_int,
    _is_mapping,
    _is_number,
    _refuse,
    _set_error,
    _stale,
)

if TYPE_CHECKING:
    from .projection import Projector

_INTERRUPT_CODES = frozenset(
    {
        Code.REMOTE_OUTCOME_UNKNOWN,
        Code.REMOTE_RESULT_INCOMPLETE,
        Code.RESULT_SIZE_LIMIT,
        Code.CALLER_CANCELLED,
        Code.BROKER_SHUTDOWN,
    }
)


_PER_ATTEMPT_FACTS = (
    "status",
    "exit_status",
    "exit_signal",
    "response_sha256",
    "steps",
    "evidence_from",
    "result_size_limit",
)
_DISPATCH_FACTS = ("connection", "reused_connection", "peer", "hop")
# The same as sets: one C-level ``isdisjoint`` skips the loops when nothing is there (a first
# dispatch has no per-attempt facts yet).
_PER_ATTEMPT_SET, _DISPATCH_SET = frozenset(_PER_ATTEMPT_FACTS), frozenset(_DISPATCH_FACTS)
_NEW_ATTEMPT: dict[str, Any] = {
    "dispatch_started": True,
    "dispatch_seq": None,
    "request_complete": False,
    "response_headers_received": False,
    "response_complete": False,
}
"""What a dispatch sets in the evidence, in this order (``dispatch_seq`` is the event's)."""


def _on_dispatch(p: Projector, event: Event) -> None:
    attrs = event.attrs
    gen = attrs.get("generation", p._generation)
    if (type(gen) is not int and not _is_int(gen)) or gen != p._generation:
        _refuse(
            p, event, f"stale generation {gen}; the current lease generation is {p._generation}"
        )
    # A new attempt: per-attempt flags start over; dispatch_started never goes back.
    ev = p._evidence
    ev.update(_NEW_ATTEMPT)
    ev["dispatch_seq"] = event.seq
    if not ev.keys().isdisjoint(_PER_ATTEMPT_SET):
        for k in _PER_ATTEMPT_FACTS:
            if k in ev:
                del ev[k]
    if not attrs.keys().isdisjoint(_DISPATCH_SET):
        for k in _DISPATCH_FACTS:
            if k in attrs:
                ev[k] = attrs[k]
    p._code = None
    p._message = None
    p._field = None
    p._retry_after = None
    attempts = p._attempts
    attempts.append(
        {
            "n": len(attempts) + 1,
            "generation": p._generation,
            "stage": "dispatch",
            "outcome": _UNKNOWN,
            "code": None,
            "seq": event.seq,
        }
    )


def _on_request_sent(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    p._evidence["request_complete"] = True


def _on_response_started(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    ev = p._evidence
    ev["response_headers_received"] = True
    if "status" in event.attrs:
        ev["status"] = event.attrs["status"]


_RESULT_FACTS = (
    "status",
    "exit_status",
    "exit_signal",
    "response_sha256",
    "remote_request_id",
    "redirect_not_followed",
)


def _on_complete(p: Projector, event: Event) -> str:
    attrs = event.attrs
    gen = attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    raw = attrs.get("outcome")
    outcome = _RESOLVED_BY_VALUE.get(raw) if type(raw) is str else None
    if outcome is None:
        _refuse(p, event, "attrs.outcome must be rejected or committed")
    ra = attrs.get("retry_after")
    if ra is not None and not _is_number(ra):
        _refuse(p, event, "attrs.retry_after must be a non-negative number of seconds")
    if event.source is not _REMOTE_RESPONSE:
        _refuse(p, event, "a complete result must come from remote_response")
    hop = attrs.get("evidence_from")
    if hop is not None:  # a call only when there is one to check (most results name none)
        hop = _evidence_from(p, event)
    raw_code = attrs.get("code")
    if raw_code is None:
        if outcome is not _COMMITTED:
            _refuse(p, event, "a rejection needs a code")
        code = None
    else:
        code = _CODE_BY_VALUE.get(raw_code) if type(raw_code) is str else None
        if code is None:
            _refuse(p, event, "attrs.code is not a known code")
        info = CODES[code]
        if info.phase is not _REMOTE_EXECUTION or info.outcome is not outcome:
            _refuse(p, event, f"{code.value} cannot classify a {raw} result")
    # -- validated: apply --
    ev = p._evidence
    ev["response_complete"] = True
    ev["response_headers_received"] = True
    ev["source"] = _SOURCE[event.source]
    for k in _RESULT_FACTS:
        if k in attrs:
            ev[k] = attrs[k]
    if hop is not None:
        ev["evidence_from"] = hop
    _set_error(p, event, code)
    p._retry_after = float(ra) if ra is not None else None
    attempts = p._attempts
    if attempts and attempts[-1]["stage"] == "dispatch":  # the attempt learns its outcome
        attempt = attempts[-1]
        attempt["outcome"] = raw
        attempt["code"] = raw_code
    return cast(str, raw)


def _on_interrupted(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    code = _code_of(event)
    if code not in _INTERRUPT_CODES:
        _refuse(p, event, "attrs.code must be one of " + ", ".join(sorted(_INTERRUPT_CODES)))
    hop = event.attrs.get("evidence_from")
    if hop is not None:
        hop = _evidence_from(p, event)
    over = _result_size_limit(p, event, code)
    _set_error(p, event, code)
    p._evidence["source"] = _SOURCE[event.source]
    if hop is not None:
        p._evidence["evidence_from"] = hop
    if over is not None:
        p._evidence["result_size_limit"] = over
    attempts = p._attempts
    if attempts and attempts[-1]["stage"] == "dispatch":
        attempts[-1]["code"] = event.attrs.get("code")


def _result_size_limit(p: Projector, event: Event, code: Code | None) -> Mapping[str, Any] | None:
    """attrs.result_size_limit: the evidence RESULT_SIZE_LIMIT stands on, and only it -- the
    target's ``max_result`` and the bytes received past it (``decoded_bytes`` too when a body
    was decoded before it was stored), or, for a result that echoed a secret, was not scanned
    whole, or (a target with a secret) was cut short, its end withheld, ``received_withheld``
    ("redacted" | "short_redacted" | "tail_redacted" | "unscanned") instead of the counts."""
    value = event.attrs.get("result_size_limit")
    if code is not Code.RESULT_SIZE_LIMIT:
        if value is not None:
            _refuse(p, event, "attrs.result_size_limit goes only with RESULT_SIZE_LIMIT")
        return None
    if not _is_mapping(value) or not _size_evidence(value):
        _refuse(
            p,
            event,
            "RESULT_SIZE_LIMIT needs attrs.result_size_limit {limit, received_bytes} or "
            '{limit, received_withheld: "redacted" | "short_redacted" | "tail_redacted" | '
            '"unscanned"}',
        )
    return value


_RECEIVED_WITHHELD = frozenset({"redacted", "short_redacted", "tail_redacted", "unscanned"})
_COUNTED = frozenset({"received_bytes", "decoded_bytes"})


def _size_evidence(value: Mapping[str, Any]) -> bool:
    """``{limit, received_bytes, decoded_bytes?}``, or ``{limit, received_withheld}`` without
    a count beside it (a withheld count is not told anywhere)."""
    withheld = value.get("received_withheld")
    if withheld is None:
        wanted: tuple[str, ...] = ("limit", "received_bytes")
    elif type(withheld) is str and withheld in _RECEIVED_WITHHELD and not _COUNTED & set(value):
        wanted = ("limit",)
    else:
        return False
    return all(_is_int(value.get(k)) and value[k] >= 0 for k in wanted)


_HOPS = frozenset({"origin", "proxy"})


def _evidence_from(p: Projector, event: Event) -> Mapping[str, Any] | None:
    """attrs.evidence_from: which hop produced the evidence (seed: "Record which hop produced
    the evidence"), as ``{"hop": "origin" | "proxy", "proxy"?, "status"?, "proxy_status"?}``."""
    value = event.attrs.get("evidence_from")
    if value is None:
        return None
    if not _is_mapping(value) or value.get("hop") not in _HOPS:
        _refuse(p, event, 'attrs.evidence_from must be an object whose hop is "origin" or "proxy"')
    return value


def _on_result_committed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    p._evidence["result"] = {
        "seq": event.seq,
        "sha256": event.attrs.get("sha256"),
        "chunks": event.attrs.get("chunks"),
    }


def _on_store_failed(p: Projector, event: Event) -> None:
    gen = event.attrs.get("generation")
    if gen is not None and (type(gen) is not int or gen != p._generation):
        _stale(p, event, gen)
    _set_error(p, event, _STORE_FAILED)


def _on_delivery_failed(p: Projector, event: Event) -> None:
    p._result_code = p._code
    if p._requester is None:
        # A record naming no requester (written before requesters were recorded): no read
        # delivers it (``engine.delivery.requested_by``), so RESULT_DELIVERY_FAILED's "fetch
        # it" would send every reader to fetch it again, for ever.  It keeps its stored
        # result's code, message and hint (``retry.static_retry_hint``), as another uid's read
        # shows it.
        return
    _set_error(p, event, _DELIVERY_FAILED)


def _on_delivered(p: Projector, event: Event) -> None:
    if p._code is _DELIVERY_FAILED:
        # Delivery now succeeded: the remote result's own classification stands again.
        p._code = p._result_code
        p._message = None
    p._evidence["delivered_seq"] = event.seq


_LISTS = frozenset({"steps", "stale_workers", "reconcile_queries"})
"""Evidence fields holding lists: a protocol's facts cannot be merged into them."""


def _on_observed(p: Projector, event: Event) -> None:
    attrs = event.attrs
    gen = attrs.get("generation")
    if gen is not None:
        if type(gen) is not int or gen != p._generation:
            _stale(p, event, gen)
        # The lifecycle takes PROTOCOL_OBSERVED in every state (a diagnostic); an attempt's
        # other events only while it is open, so only here can a closed one's arrive.
        if p._state in _CLOSED:
            _closed(p, event, gen)
        if p._fenced is not None:  # its binder's connection setup, its first event refused
            _refuse(p, event, _FENCED)
    proto = attrs.get("protocol", "protocol")
    if not isinstance(proto, str) or not proto.isidentifier():
        _refuse(p, event, "attrs.protocol must be an identifier")
    ev = p._evidence
    known = ev.get(proto, _NO_FACTS)
    if (type(known) is not dict and not isinstance(known, dict)) or proto in _LISTS:
        _refuse(p, event, f"attrs.protocol {proto!r} collides with an evidence field")
    state = attrs.get("state")
    if not isinstance(state, str):
        _refuse(p, event, "attrs.state must name the protocol state")
    facts = attrs.get("facts")
    if facts is not None and type(facts) is not dict and not _is_mapping(facts):
        _refuse(p, event, "attrs.facts must be an object")
    # -- validated: apply (by replacing values, never editing them; see Projector) --
    step = f"{proto}.{state}"
    steps = ev.get("steps")
    ev["steps"] = [*steps, step] if steps else [step]
    if facts:
        ev[proto] = {**known, **facts}


_NO_FACTS: dict[str, Any] = {}
