"""Whether a stored result may be read to decide anything -- one rule for every reader.

A result's summary may say its body is not the whole of what the remote sent: ``body_withheld``
(a coding the broker does not decode, a corrupt or cut gzip/deflate stream, a decompression
bomb: ``protocols/http/decoding.py``) and ``body_truncated`` (a prefix was kept: what decoded
before the failure, or a 3xx's buffered part).  A JSON prefix such as ``{"found":"yes"}`` may
still parse; what followed it -- the rest of the document, the gzip trailer that would have
proved the bytes -- was never seen.  And a followed redirect may end on another origin
(``redirect_origins``), or on the target's origin outside its base path: either hop's request
went without the target's credential, and its answer says nothing of the target's state.

So every reader that decides from a stored result -- a reconciliation verdict
(``affidavit.reconcile``), a job's state read by a poll and the job a 202 names
(``engine/operations.py``, ``engine/contracts.py``), a batch's item outcomes -- asks
``unreadable`` first; a result it names a reason for decides nothing.  The same test says
which received streams were scanned whole (``engine/delivery.py``, ``received_evidence``).

Seed: "never claim more than the journal proves."
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["OTHER_ORIGIN", "PARTIAL_BODY", "from_elsewhere", "stream_cut", "unreadable"]

PARTIAL_BODY: Final = (
    "the answer's body was not received whole and verified (body_withheld or "
    "body_truncated): it settles nothing"
)
"""Why a result whose body (or any stream) is withheld or truncated decides nothing -- stable
text, the ``reason`` of RECONCILE_INCONCLUSIVE and OPERATION_POLL_FAILED."""

OTHER_ORIGIN: Final = (
    "the answer came from another origin than the target's, or from outside its base path (a "
    "followed redirect sent without the credential): it settles nothing"
)
"""Why a result whose final hop is not on the target's origin, or went there without the
credential, decides nothing -- stable text."""


def stream_cut(summary: Mapping[str, Any], name: str) -> bool:
    """Whether the stored stream ``name`` is not the whole of what was received: withheld (in
    part or whole) or truncated."""
    return summary.get(f"{name}_withheld") is not None or bool(summary.get(f"{name}_truncated"))


def _streams(summary: Mapping[str, Any]) -> set[str]:
    """Every stream the summary says something of being withheld or truncated."""
    out = set()
    for key in summary:
        for suffix in ("_withheld", "_truncated"):
            if key.endswith(suffix):
                out.add(key.removesuffix(suffix))
    return out


def unreadable(summary: Mapping[str, Any], *, origin: str | None = None) -> str | None:
    """Why the stored result ``summary`` may not be read to decide anything, or None.

    A stream withheld or truncated: ``PARTIAL_BODY``.  With ``origin`` (the target's, as
    ``origin_of`` normalizes it -- for reconciliation queries, polls, and a batch's items or a
    202's job read from the result, which only the target can answer for): a final hop on any
    other origin or sent without the credential, ``OTHER_ORIGIN``."""
    if any(stream_cut(summary, name) for name in _streams(summary)):
        return PARTIAL_BODY
    if origin is not None and from_elsewhere(summary, origin=origin):
        return OTHER_ORIGIN
    return None


def from_elsewhere(summary: Mapping[str, Any], *, origin: str) -> bool:
    """Whether the stored result's final hop is on another origin than ``origin`` (the
    target's), or its request went without the credential: an answer a followed redirect
    fetched elsewhere.  The origin alone does not say it: ``POST /v1/jobs`` -> 308 to
    ``/legacy/jobs`` (same origin, outside the base path ``/v1``: the policy drops the
    credential) -> 202 ``Location: status/j9`` named ``/status/j9`` a poll would have sent the
    credential to.  ``credential_sent`` is the adapter's (``adapters/http/client.py``); a hop
    recorded before it existed proves the credential went only as the caller's own request
    (a single hop)."""
    hops = summary.get("hops")
    if not isinstance(hops, list) or not hops:
        return False
    last = hops[-1]
    # A decoded summary's hop is a dict: ``Mapping`` would be an ABC check on every call's path.
    if not isinstance(last, dict) or last.get("origin") != origin:
        return True
    return last.get("credential_sent", len(hops) == 1) is not True
