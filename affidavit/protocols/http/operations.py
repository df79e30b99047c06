"""The ``operations`` setting: how a target's asynchronous jobs are read and queried.

Seed: "A complete HTTP 202 response confirms that the job was accepted, not that the queued work
was completed.  Record the job identifier and its status resource returned by the service, and
then track the job as a separate operation."  So, on a target that declares ``operations``, a
complete 202 yields the job id and the status resource (``read_operation``); a poll is a GET of
that resource on the *same* target -- same credential, same origin and base path, never another
origin (``poll_action``) -- and its complete 2xx answer names the job's state
(``poll_state``).  The engine hands these readers a body only when it is whole, and takes a
poll's state only from the target's own origin (``affidavit.engine.readable``): a cut body is
read as none.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from affidavit.adapters.base import RemoteResult
from affidavit.adapters.http.urls import split_url
from affidavit.protocols.spec import MIN_POLL_INTERVAL
from affidavit.schema import Field, Read, Schema, duration_setting
from affidavit.statemachine import Outcome

from .selectors import ABSENT, Selector, json_body, scalar, select, selector_field

if TYPE_CHECKING:  # target.py declares the ``operations`` field with this module's schema
    from .target import HttpTarget

__all__ = [
    "OPERATIONS",
    "OperationsContract",
    "min_poll_interval",
    "poll_action",
    "poll_state",
    "read_operation",
]

MAX_URL = 8192
"""Longest status resource URL taken from a 202 (the longest action path the broker sends)."""
ACCEPTED = 202
"""RFC 9110 §15.3.3: "the request has been accepted for processing, but the processing has not
been completed"."""


@dataclass(frozen=True)
class OperationsContract:
    id: Selector
    status_url: Selector
    status: Selector
    succeeded: frozenset[str]
    failed: frozenset[str]
    min_poll_interval: float = MIN_POLL_INTERVAL


def _states(r: Read) -> frozenset[str]:
    values = r.string_list()
    if not values:
        raise r.error("must list at least one value")
    return frozenset(values)


def _failed(r: Read) -> frozenset[str]:
    values = _states(r)
    both = sorted(values & r.values["succeeded"])
    if both:
        raise r.error(f"names values that also mean succeeded: {', '.join(both)}")
    return values


OPERATIONS = Schema(
    OperationsContract,
    (
        Field(
            "id",
            selector_field("json", "header"),
            default="json:/id",
            doc="where the 202 names the job",
        ),
        Field(
            "status_url",
            selector_field("json", "header"),
            default="header:Location",
            doc="where the 202 names the job's status resource; after a followed redirect only an"
            " absolute one or one from the root (`/v1/jobs/j9`) is taken: a relative one resolves"
            " against the last hop's URL, which is not recorded",
        ),
        Field(
            "status",
            selector_field("json", "header"),
            default="json:/status",
            doc="where the status resource's answer names the job's state",
        ),
        Field(
            "succeeded",
            _states,
            default=["succeeded"],
            shown='`["succeeded"]`',
            doc="state values meaning the job succeeded",
        ),
        Field(
            "failed",
            _failed,
            default=["failed"],
            shown='`["failed"]`',
            doc="state values meaning the job failed",
        ),
        Field(
            "min_poll_interval",
            duration_setting,
            default=MIN_POLL_INTERVAL,
            shown='`"1s"`',
            doc="the least time between two polls of an operation that reach the status resource "
            "(a duration or seconds); a poll sooner, from any caller, is refused `POLL_TOO_SOON` "
            "with `Retry-After`, nothing asked or recorded (an ended job is still answered, also "
            "one that ended while the refused poll was being checked; an open poll is still taken "
            "up, but one never sent -- denied, expired -- is closed, that one row written, and the "
            "poll asked anew is paced): a job's record grows by at most a poll per interval. "
            "Across brokers sharing a journal the pace is best effort: each reads when the last "
            "poll was recorded from its row, labelled by the writer's wall clock (a row labelled "
            "ahead holds a poll back one interval at most; a clock behind lets one through "
            "sooner), and two brokers checking at the same moment may both poll",
            binding=False,
            reason="how often an operation may be polled changes neither what a call sends nor "
            "to whom: a same-key retry across a change of it is the same request, and a target's "
            "snapshot from before the setting keeps its hash",
        ),
    ),
)


def min_poll_interval(target: HttpTarget) -> float:
    """The seconds between two polls of an operation on ``target`` that reach it
    (``MIN_POLL_INTERVAL`` unless it says)."""
    contract = target.operations
    return contract.min_poll_interval if contract is not None else MIN_POLL_INTERVAL


def parse_operations(r: Read) -> OperationsContract | None:
    """The ``operations`` field: a table of ``OPERATIONS``; polls need GET on the target."""
    contract = OPERATIONS.parse_optional_table(r)
    if contract is not None and "GET" not in r.values["methods"]:
        raise r.error("needs GET in the target's methods: a job's status resource is read by GET")
    return contract


def read_operation(
    action: Any, target: HttpTarget, result: RemoteResult, body: bytes | None
) -> Mapping[str, Any] | None:
    """The job a complete 202 accepted, or None (no ``operations`` setting, or not a 202)."""
    contract = target.operations
    if (
        contract is None
        or result.summary.get("status") != ACCEPTED
        or result.outcome is not Outcome.COMMITTED
        or result.code is not None
    ):
        return None
    headers = result.summary.get("headers", ())
    doc = json_body(body) if "json" in (contract.id.source, contract.status_url.source) else None
    job = scalar(select(contract.id, headers, doc))
    raw = select(contract.status_url, headers, doc)
    usable = isinstance(raw, str) and 0 < len(raw) <= MAX_URL
    redirected = len(result.summary.get("hops") or ()) > 1
    status_url, status_path = _status_resource(
        target, action, raw if usable else None, redirected=redirected
    )
    return {
        "job_id": None if job is None else str(job),
        "status_url": status_url,
        "status_path": status_path,
    }


def _status_resource(
    target: HttpTarget, action: Any, raw: str | None, *, redirected: bool
) -> tuple[str | None, str | None]:
    """(absolute status URL, its path for an action on ``target``); the path is None when the
    URL is not on the target's origin and base path -- the credential never goes elsewhere.

    A relative reference is resolved against the URL of the request the 202 answers (RFC 9110
    §10.2.2).  After a followed redirect that is the last hop's, which the record does not keep
    (its Location may echo the credential): ``/v1/jobs`` -> 308 ``/v1/v2/jobs`` -> 202
    ``Location: status/j9`` is ``/v1/v2/status/j9``, and resolved against the caller's path it
    named ``/v1/status/j9`` -- another resource, polled with the credential.  So after a
    redirect only a reference that does not depend on the request's path is taken: absolute,
    or from the root (the last hop is on the target's origin: engine/readable.py)."""
    from .target import origin_of  # (import cycle: target.py imports this module)

    if raw is None:
        return None, None
    if redirected and not _path_independent(raw.strip()):
        return None, None
    request_url = target.url + action.path  # (``url`` holds the base path, default port dropped)
    try:
        url = urllib.parse.urldefrag(urllib.parse.urljoin(request_url, raw.strip())).url
        origin = origin_of(url)
    except ValueError:
        return None, None
    parts = urllib.parse.urlsplit(url)
    base = target.base_path
    if origin != target.origin or not (parts.path == base or parts.path.startswith(base + "/")):
        return url, None
    path = parts.path[len(base) :] or "/"
    return url, path + (f"?{parts.query}" if parts.query else "")


def _path_independent(ref: str) -> bool:
    """Whether resolving ``ref`` keeps none of the base URL's path: it has a scheme, an
    authority (``//host/...``) or a path from the root.  ``?x``, ``#f``, ``""`` and ``a/b``
    all keep it (RFC 3986 §5.2.2)."""
    parts = split_url(ref)  # uncached: a Location may echo the credential
    return bool(parts.scheme or ref.startswith("//") or parts.path.startswith("/"))


def poll_action(target: HttpTarget, operation: Mapping[str, Any]) -> dict[str, Any]:
    """The GET that queries the job's status resource on ``target``."""
    path = operation.get("status_path")
    if not path:
        if operation.get("status_url"):
            raise ValueError(
                "the job's status resource is not on this target's origin and base path; the "
                "broker sends its credential nowhere else -- reconcile the job by hand"
            )
        raise ValueError("the 202 named no status resource to query -- reconcile the job by hand")
    return {"target": target.name, "method": "GET", "path": path}


def poll_state(
    target: HttpTarget, summary: Mapping[str, Any], body: bytes | None
) -> tuple[str | None, Any]:
    """(pending | succeeded | failed, the value read) from the status resource's answer; (None,
    None) when it names no state -- or is no 2xx (a 303 to the result, a 204) at all."""
    contract = target.operations
    assert contract is not None
    status = summary.get("status")
    if not (isinstance(status, int) and 200 <= status < 300):
        return None, None
    doc = json_body(body) if contract.status.source == "json" else None
    value = scalar(select(contract.status, summary.get("headers", ()), doc))
    if value is None or value is ABSENT:
        return None, None
    text = str(value)
    if text in contract.succeeded:
        return "succeeded", value
    if text in contract.failed:
        return "failed", value
    return "pending", value
