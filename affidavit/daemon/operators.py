"""The daemon's operator routes: approvals and reconciliation, through ``affidavit.approvals``
and ``affidavit.reconcile`` with the socket peer as the identity.

    GET  /v1/approvals                      requests waiting for a decision     (operators)
    GET  /v1/approvals/{id}                 one invocation's approval          (operators)
    GET  /v1/approvals/{id}/content/{name}  its body or stdin, the exact bytes (operators)
    POST /v1/approvals/{id}/approve         {"note"?} -> the approval          (operators)
    POST /v1/approvals/{id}/deny            {"note"?} -> the approval          (operators)
    POST /v1/approvals/{id}/revoke          {"note"} -> the approval           (operators)
    POST /v1/invocations/{id}/reconcile     {"query": true} (anyone admitted) or
                                            {"attest": "committed"|"rejected", "note"} (operators)
    POST /v1/console/login                  -> {"url", "expires_at"}: a one-time login link to
                                            the operator console for the peer (operators)

The peer is the kernel's word (SO_PEERCRED, ``peer.py``), checked against ``[service]
operator_uids`` / ``operator_gids``; the requester of an approval may not decide on it unless
``allow_self_approval``.  A refusal is an API error with the service's stable code
(``NOT_AN_OPERATOR``, ``SELF_APPROVAL``, ``NOT_PENDING``, ``APPROVAL_EXPIRED``,
``NOT_UNKNOWN``, ...); a body field a route does not take is ``INVALID_FIELD`` and a field
of the wrong type ``BAD_REQUEST``, each naming the field.  ``POST /v1/calls`` never decides
anything: no call approves, and no peer but an operator gets a console login (an agent on the
socket or behind MCP cannot).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from affidavit.approvals import Operator, OperatorError, service
from affidavit.console import TokenDirError, login_url
from affidavit.journal import JournalError, JournalReader
from affidavit.reconcile import service as reconciling
from affidavit.text import printable

from .calls import internal_problem
from .http import ApiProblem, Request, named

if TYPE_CHECKING:
    from .app import Answering, Api

__all__ = [
    "RECORD_CHECK",
    "act_problem",
    "approval",
    "approvals",
    "console_login",
    "content",
    "decide",
    "reconcile",
]

T = TypeVar("T")
log = logging.getLogger("affidavit.daemon")

RECORD_CHECK = "the record of {0} (GET /v1/invocations/{0}, MCP's get_record)"
"""How a caller of the daemon reads what a poll or a query the journal did not take recorded
(``{0}``: the reconciled invocation, or the job's submission, whose record holds its polls) --
the act's ``check`` (``reconcile.service.failure``, ``poll_failure``): in the words of the
socket, which an HTTP client, ``affidavit`` run against the daemon and an agent behind ``affidavit
mcp --socket`` (the proxy passes the words on) all read, never one interface's command."""


def operator_of(req: Request) -> Operator:
    peer = req.peer
    return Operator.peer(peer.uid, peer.gid, tuple(peer.groups))


def _require(api: Api, req: Request, action: str) -> Operator:
    who = operator_of(req)
    try:
        api.broker.operator_policy.require(who, action)
    except OperatorError as exc:
        raise _problem(exc) from None
    return who


def _problem(exc: OperatorError) -> ApiProblem:
    return ApiProblem(exc.status, exc.code, exc.message, exc.field)


async def _run(
    work: Callable[[], Awaitable[T]], failure: Callable[[Exception], tuple[int, str, str]]
) -> T:
    """``work()``: a refusal as its API error; a journal that could not do it as ``failure``
    answers it (503 JOURNAL_UNAVAILABLE when away) -- one line in the log, never a traceback."""
    try:
        return await work()
    except OperatorError as exc:
        raise _problem(exc) from None
    except JournalError as exc:
        raise act_problem(exc, failure(exc)) from None


def act_problem(exc: JournalError, answer: tuple[int, str, str]) -> ApiProblem:
    """An act the journal could not take (``answer``: ``act_failure``'s status, code and
    message) as the API's problem, with one line in the log -- never a traceback, never a
    line of the caller's own (an id from the path may hold a line break: escaped)."""
    status, code, message = answer
    log.warning("%s: %s", printable(message), printable(str(exc)))
    return ApiProblem(status, code, message)


async def _reading(api: Api, req: Request, view: Callable[[JournalReader], T], what: str) -> T:
    """A view on a read-only connection of its own, in a worker thread (``Api._read``), in
    the operator's share (``Api.asker``)."""
    try:
        result: T = await api._read(view, what, api.asker(req))
    except OperatorError as exc:
        raise _problem(exc) from None
    return result


async def approvals(api: Api, req: Request) -> None:
    _require(api, req, "list approvals")
    await req.respond_json(await _reading(api, req, service.pending, "the pending approvals"))


async def approval(api: Api, req: Request, invocation_id: str) -> None:
    _require(api, req, "see approvals")
    await req.respond_json(
        await _reading(
            api, req, lambda r: service.show(r, invocation_id), f"the approval of {invocation_id}"
        )
    )


async def content(api: Api, req: Request, invocation_id: str, name: str) -> None:
    """One content of the approval's request whole (``service.content``: the accepted bytes,
    served only when their hash is the view's), as ``application/octet-stream``."""
    _require(api, req, "see approvals")
    data = await _reading(
        api,
        req,
        lambda r: service.content(r, invocation_id, name),
        f"the approval of {invocation_id}",
    )
    await req.respond(200, data, b"application/octet-stream")


async def decide(api: Api, req: Request, invocation_id: str, verb: str) -> None:
    body = _fields(await req.json_object(), DECISION_FIELDS)
    who = _require(api, req, "revoke an approval" if verb == "revoke" else "approve or deny")
    note = _note(body)
    blind = body.get("blind", False)
    if not isinstance(blind, bool) or (blind and verb != "approve"):
        raise ApiProblem(
            400, "BAD_REQUEST", "blind: expected true or false, and only to approve", "blind"
        )

    def decision() -> Awaitable[dict[str, Any]]:
        if verb == "approve":
            return api.broker.approve(invocation_id, note=note, operator=who, blind=blind)
        if verb == "revoke":
            return api.broker.revoke(invocation_id, note=note, operator=who)
        return api.broker.deny(invocation_id, note=note, operator=who)

    view = await _run(
        decision,
        lambda exc: service.decision_failure(exc, invocation_id),
    )
    await req.respond_json(view)


async def reconcile(api: Api, req: Request, invocation_id: str) -> None:
    body = _fields(await req.json_object(), RECONCILE_FIELDS)
    attest = body.get("attest")
    query = body.get("query", False)
    if not isinstance(query, bool):
        raise ApiProblem(
            400, "BAD_REQUEST", 'query: expected true or false (give {"query": true})', "query"
        )
    if attest is not None and not isinstance(attest, str):
        raise ApiProblem(
            400, "BAD_REQUEST", 'attest: expected a string ({"attest": ..., "note"})', "attest"
        )
    who = _require(api, req, "attest an outcome") if attest is not None else operator_of(req)
    timeout = req.timeout_param()
    note = _note(body)
    try:  # before any slot is asked for: never 503 OVERLOADED first, then 400 on a retry
        reconciling.note_refused(query, note)
    except OperatorError as exc:
        raise _problem(exc) from None
    if query and not api.calls.accepting:  # a query is a call: none is taken once stopping
        raise ApiProblem(503, "SHUTTING_DOWN", "the broker is shutting down; call again later")
    if query:  # it journals a linked invocation: one of the uid's calls (429 RATE_LIMITED)
        api.take_call(req)

    deliver: Answering | None = None  # a query's result: delivered by its answer

    async def work() -> dict[str, Any]:
        # A query is a call: refused OVERLOADED past ``max_calls``, stopped at the grace's end.
        nonlocal deliver
        control = None
        try:
            with api.calls.linked(capped=query) as running:
                control = running.control
                deliver = api.answering(req, running) if query else None
                return await api.broker.reconcile(
                    invocation_id,
                    query=query,
                    attest=attest,
                    note=note,
                    operator=who,
                    timeout=timeout,
                    control=control,
                    requester=req.peer.uid,  # a query may not be approved by its asker
                    deliver=deliver,
                )
        except (ApiProblem, OperatorError, JournalError):
            raise  # refusals, and the journal's own failure: ``_run``'s to answer
        except Exception as exc:  # a bug: named, as a call's (never the h11 server's traceback)
            raise internal_problem(exc, control, "a reconciliation") from None

    answer = await _run(
        work, lambda exc: reconciling.failure(exc, invocation_id, check=RECORD_CHECK)
    )
    if deliver is None:
        await req.respond_json(answer)
    else:
        await deliver.unless_tried(answer)


DECISION_FIELDS = ("note", "blind")
RECONCILE_FIELDS = ("query", "attest", "note")


def _fields(body: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """``body`` when it holds no field but ``known``; else 400 ``INVALID_FIELD`` naming the
    first other one (as the call API refuses an action's unknown field: a misspelt ``note``
    silently dropped would leave a decision without the words its operator gave).  A name
    that is not plain printable text, or is long, is not echoed: ``body`` stands for it."""
    for key in sorted(body):
        if key not in known:
            shown = named(key, "body")
            takes = f"the body takes {', '.join(known)}" if known else "the body takes no field"
            raise ApiProblem(400, "INVALID_FIELD", f"{shown}: unknown field ({takes})", shown)
    return body


def _note(body: dict[str, Any]) -> str | None:
    note = body.get("note")
    if note is not None and not isinstance(note, str):
        raise ApiProblem(400, "BAD_REQUEST", "note: expected a string", "note")
    return note


async def console_login(api: Api, req: Request) -> None:
    """A one-time console login link for the peer (``affidavit console-url --socket``).  The
    body takes no field (``{}`` or empty): any other is refused ``INVALID_FIELD``, as on the
    other operator routes, before anything is minted -- a link is for the peer the kernel
    names, never for an ``operator`` or ``ttl`` a body might ask for."""
    _fields(await req.json_object(), ())
    who = _require(api, req, "open the operator console")
    if api.tokens is None or api.console_url is None:
        raise ApiProblem(
            409,
            "NO_CONSOLE",
            "this daemon serves no console (affidavit serve --console 127.0.0.1:PORT, or "
            "[service] console)",
        )
    try:
        token, expires = api.tokens.mint(who)
    except TokenDirError as exc:
        raise ApiProblem(500, "CONSOLE_TOKENS", str(exc)) from None
    await req.respond_json({"url": login_url(api.console_url, token), "expires_at": expires})
