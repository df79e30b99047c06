"""The console's request handlers: its pages (approvals, actions, an invocation, its result
and an approval's content as downloads, the journal and its whole verify), the operator's
decisions and reconciliations, and the journal reads they share -- each refusing with
``Refused`` what the journal could not read or the ``Broker`` refused.  ``Console``
(``app.py``) routes to them once the request's Host, session, origin and CSRF token are proven;
they see only a request that passed those checks.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import jinja2
import markupsafe
import trio

from affidavit.api.broker import Broker
from affidavit.api.wire import parse_time
from affidavit.approvals import Operator, OperatorError, service
from affidavit.engine import (
    CallControl,
    is_invocation_id,
    read_failure,
    result_failure,
    stored_envelope,
)
from affidavit.journal import (
    AlteredRow,
    JournalError,
    JournalReader,
    JournalUnavailable,
    ReadFailed,
    SessionSummary,
)
from affidavit.reconcile import service as reconciling
from affidavit.session import MAX_SESSION

from . import pages
from .auth import Session
from .request import (
    AUTO,
    Read,
    Refused,
    Request,
    _fields,
    _journal_refusal,
    _shown,
    decision_forms,
    log,
    read_refusal,
)
from .verified import KeptVerify

Slot = Callable[[bool], AbstractContextManager[CallControl | None]]
"""A reconciliation's place among the calls in flight, entered around it (``capped``: a query,
which reaches the remote): the daemon's ``Calls.console`` -- its ``max_calls``, its shutdown
grace and stop cause, and its refusals (``Refused`` 503 OVERLOADED, SHUTTING_DOWN) -- or
``unlinked``, none of them."""


def unlinked(capped: bool) -> AbstractContextManager[CallControl | None]:
    """No host's calls to count it among (a console served on its own, in tests)."""
    return contextlib.nullcontext()


class Handlers:
    """``Console``'s pages and decisions, over the state ``Console.__init__`` sets up."""

    broker: Broker
    slot: Slot
    read: Read
    read_summarized: Read
    summary: SessionSummary
    verified: KeptVerify
    templates: jinja2.Environment

    if TYPE_CHECKING:

        def _render(self, name: str, req: Request, **context: Any) -> bytes: ...

    # -- pages --------------------------------------------------------------------------------

    async def _approvals(self, req: Request) -> None:
        rows: list[tuple[str, markupsafe.Markup | None, str | None]] = []
        found = await self._reading(pages.approvals_page, "the pending approvals")
        for row in found["rows"]:
            iid = str(row.get("invocation_id"))
            try:
                html = self.templates.get_template("approval.html").render(
                    a=row,
                    **decision_forms(req),
                )
                rows.append((iid, markupsafe.Markup(html), None))
            except Exception as exc:  # one request's failure is its own row's, not the page's
                log.exception("console: the approval %s could not be rendered", iid)
                rows.append((iid, None, f"{type(exc).__name__}: {exc}"))
        decided = req.session.take_notice("decided") if req.session else None
        page = self._render("approvals.html", req, rows=rows, decided=decided, total=found["total"])
        await req.answer(200, page)

    async def _actions(self, req: Request) -> None:
        filters = _filters(req.query)
        summary = self.summary
        data = await self._reading(
            lambda r: pages.actions_page(r, filters, summary),
            "the actions view",
            summarized=filters == pages.ActionFilters(),
        )
        shown = {k: v for k, v in req.query.items() if k != AUTO}
        page = self._render(
            "actions.html",
            req,
            f=shown,
            reload="?" + urlencode({**shown, AUTO: "1"}),
            live=req.query.get("live", "1") != "0",
            outcomes=pages.OUTCOMES,
            phases=pages.PHASES,
            codes=pages.CODES,
            **data,
        )
        await req.answer(200, page)

    async def _invocation(self, req: Request, iid: str, problem: Refused | None = None) -> None:
        start = None if problem else _row_number(req.query.get("from"))
        data = await self._reading(
            lambda r: pages.invocation_page(r, iid, start), f"the record of {_id(iid)}"
        )
        if data is None:
            raise _no_invocation(iid)
        result = None
        if data["record"]["final"]:
            result = pages.result_view(await self._envelope(iid))
        page = self._render(
            "invocation.html",
            req,
            **data,
            result=result,
            problem=problem,
            done=req.session.take_notice("done", iid) if req.session and not problem else None,
        )
        await req.answer(problem.status if problem else 200, page)

    async def _download(self, req: Request, iid: str) -> None:
        envelope = await self._envelope(iid)
        if envelope is None:
            raise _no_invocation(iid)
        body = json.dumps(envelope, sort_keys=True, indent=2).encode("utf-8") + b"\n"
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", iid)
        disposition = f'attachment; filename="{name}.json"'.encode()
        await req.answer(200, body, b"application/json", [(b"content-disposition", disposition)])

    async def _content(self, req: Request, iid: str, name: str) -> None:
        """One content of an approval's request, whole (``service.content``: the accepted
        action's bytes, checked against the view's hash): an attachment, never rendered."""
        try:
            data = await self.read(lambda r: service.content(r, iid, name))
        except OperatorError as exc:
            if exc.code == "CONTENT_MISMATCH":
                log.warning("console: refused the %s of %s: %s", name, _id(iid), exc.message)
            raise Refused.of(exc) from None
        except JournalError as exc:  # 503 JOURNAL_UNAVAILABLE when away: nothing served
            raise read_refusal(exc, read_failure(exc, f"the approval of {_id(iid)}")) from None
        file = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{iid}.{name}")
        disposition = f'attachment; filename="{file}.bin"'.encode()
        await req.answer(
            200, data, b"application/octet-stream", [(b"content-disposition", disposition)]
        )

    async def _journal(self, req: Request) -> None:
        """The journal page (``KeptVerify``: the kept verify extended to the head)."""
        data = await self._verified(whole=False)
        summary = self.summary
        sessions = await self._reading(
            lambda r: pages.journal_sessions(r, summary), "the journal view", summarized=True
        )
        await req.answer(200, self._render("journal.html", req, **data, **sessions))

    async def _verify_whole(self) -> None:
        """The operator's press: a whole verify begun in the background -- or, while one runs,
        that one (one at a time) -- answered at once: the press is sent to the page, which says
        since when the whole verify runs (marked before this answer: ``KeptVerify.begin``) and,
        once it ended, when it started and finished, or why it failed (until the next one
        ends).  A press held its connection for the verify (~41 s at 1M events).  The run is a
        task of the event loop the console is served on (the daemon's, for its lifetime),
        reading in a worker thread as every view does (the daemon's limiter)."""
        if self.verified.begin():
            trio.lowlevel.spawn_system_task(self._whole_verify)

    async def _whole_verify(self) -> None:
        """The whole verify ``_verify_whole`` began; one that did not read is kept as failed
        (``KeptVerify.failed``: a no-op when the verify recorded it itself)."""
        try:
            await self._verified(whole=True)
        except Refused as exc:
            self.verified.failed(exc.code or "JOURNAL_UNREADABLE", exc.message)
        except Exception:
            log.exception("console: the whole journal verify failed")
            self.verified.failed("CONSOLE_FAILED", "the console failed; see its log")

    async def _verified(self, whole: bool) -> dict[str, Any]:
        """The journal page but its sessions (read on their own: a whole verify that runs does
        not hold them, nor they it)."""
        kept = self.verified
        return await self._reading(  # type: ignore[no-any-return]
            lambda r: pages.journal_page(r, kept, whole),
            "the journal view",
        )

    # -- decisions ----------------------------------------------------------------------------

    async def _decide(self, req: Request, iid: str, verb: str, form: dict[str, str]) -> None:
        _fields(form, ("csrf", "note"))
        who = _operator(req)
        decision = self.broker.approve if verb == "approve" else self.broker.deny
        try:
            await decision(iid, note=form.get("note") or None, operator=who)
        except OperatorError as exc:
            raise Refused.of(exc) from None
        except JournalError as exc:  # 503 JOURNAL_UNAVAILABLE when away: nothing decided
            raise _journal_refusal(exc, service.decision_failure(exc, iid)) from None
        _operator_session(req).notice = ("decided", iid, "")
        await req.redirect("/approvals")

    async def _reconcile(self, req: Request, iid: str, form: dict[str, str]) -> None:
        _fields(form, ("csrf", "how", "note"))
        who = _operator(req)
        how = form.get("how")
        if how not in ("query", "committed", "rejected"):
            message = "how: choose query, committed or rejected"
            raise Refused(400, message, "BAD_REQUEST", field="how")
        try:
            reconciling.note_refused(how == "query", form.get("note") or None)  # before a slot
            # A query is a call: the daemon's cap, grace and stop cause are its, as on the socket.
            with self.slot(how == "query") as control:
                answer = await self.broker.reconcile(
                    iid,
                    query=how == "query",
                    attest=None if how == "query" else how,
                    note=form.get("note") or None,
                    operator=who,
                    control=control,
                    requester=who.uid,  # a query may not be approved by its asker
                    as_operator=True,  # the console shows the operator every record
                )
        except OperatorError as exc:
            return await self._invocation(req, iid, Refused.of(exc))
        except Refused as problem:  # overloaded, shutting down: nothing sent
            return await self._invocation(req, iid, problem)
        except JournalError as exc:  # the page itself could not be read now: the error page
            raise _journal_refusal(exc, reconciling.failure(exc, iid)) from None
        refused = answer.get("refused")
        if refused is not None:  # the query ran; the record moved on meanwhile
            query_id = (answer.get("query") or {}).get("invocation_id")
            message = f"{refused['message']} (the query ran: {query_id}, linked in the timeline)"
            return await self._invocation(req, iid, Refused(409, message, refused["code"]))
        done = "reconciled" if answer["reconciled"] else "inconclusive"
        _operator_session(req).notice = ("done", iid, done)
        await req.redirect(f"/invocations/{quote(iid, safe='')}")

    # -- reading ------------------------------------------------------------------------------

    async def _reading(
        self, view: Callable[[JournalReader], Any], what: str, summarized: bool = False
    ) -> Any:
        try:
            return await (self.read_summarized if summarized else self.read)(view)
        except JournalError as exc:  # 503 JOURNAL_UNAVAILABLE naming ``what`` when away
            raise read_refusal(exc, read_failure(exc, what)) from None
        except OperatorError as exc:
            raise Refused(500, f"the journal could not be read: {exc}", exc.code) from None

    async def _envelope(self, iid: str) -> dict[str, Any] | None:
        """The stored envelope, read as a resumed read from chunk 0: it records nothing (the
        console is not the caller; its look is no delivery).  A closed record's is read in a
        view thread (``read``: a database slow to answer it stalls this page alone, never the
        calls); an open one's through the broker (``Broker.fetch_result``), on the event loop,
        which closes it first if its holder's lease ran out (recovery's write)."""

        # The envelope as the caller was answered it: its lease holder tagged by the broker's
        # own reader, which holds the broker key (``affidavit journal holder`` maps it back).
        tag = self.broker.journal.holder_tag

        def stored(r: JournalReader) -> dict[str, Any] | bool | None:
            record = r.record(iid)
            if record is None:
                return None
            return stored_envelope(r, record, 0, holder=tag) if record.final else False

        try:
            found: dict[str, Any] | bool | None = await self.read(stored)
            if found is False:
                found = await self.broker.fetch_result(iid, from_chunk=0, as_operator=True)
        except (JournalUnavailable, ReadFailed, AlteredRow) as exc:  # not unverified: unread
            # (away, declined) or a row altered in place, in the words of every console page
            raise read_refusal(exc, read_failure(exc, f"the result of {iid}")) from None
        except JournalError as exc:  # RESULT_UNVERIFIED, as every surface (``result_failure``)
            raise read_refusal(exc, result_failure(exc, iid)) from None
        assert not isinstance(found, bool)
        return found


def _operator(req: Request) -> Operator:
    return _operator_session(req).operator


def _operator_session(req: Request) -> Session:
    assert req.session is not None
    return req.session


def _row_number(value: str | None) -> int | None:
    """The ``from`` of an invocation's page: the timeline row its page of rows starts at."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 9):
        raise Refused(400, "from: a timeline row number, 0 or more", "INVALID_FIELD", field="from")
    return int(value)


def _id(iid: str) -> str:
    """An id of the path, for a message or a log line: itself when it has an invocation id's
    form (``is_invocation_id``: bounded, printable -- ``_shown`` all the same), else no echo
    of what an agent wrote into a link."""
    return _shown(iid, "an invocation") if is_invocation_id(iid) else "an invocation"


def _no_invocation(iid: str) -> Refused:
    """404 ``NO_SUCH_INVOCATION`` for an id with no record: named only when it is an id's form
    (``_id``), else "no such invocation" -- the page shows back no text an agent chose."""
    if not is_invocation_id(iid):
        return Refused(404, "no such invocation", "NO_SUCH_INVOCATION")
    return Refused(404, f"no invocation {_id(iid)} in the journal", "NO_SUCH_INVOCATION")


def _session_filter(query: Mapping[str, str]) -> str | None:
    """The ``session`` filter, or none: one longer than a session name may be
    (``affidavit.session``: ``MAX_SESSION``) matches no action and is refused, never shown
    back -- an agent's link would otherwise echo kilobytes of its text in the filter's box.
    (One of other characters is kept: it matches nothing, and its box shows it escaped.)"""
    value = query.get("session") or None
    if value is not None and len(value) > MAX_SESSION:
        message = f"session: a session name, at most {MAX_SESSION} characters"
        raise Refused(400, message, "INVALID_FIELD", field="session")
    return value


def _filters(query: Mapping[str, str]) -> pages.ActionFilters:
    def pick(name: str, allowed: list[str]) -> str | None:
        value = query.get(name) or None
        if value is not None and value not in allowed:
            message = f"{name}: expected one of {', '.join(allowed)}"
            raise Refused(400, message, "INVALID_FIELD", field=name)
        return value

    def when(name: str) -> float | None:
        value = query.get(name) or None
        try:
            return parse_time(value) if value else None
        except ValueError as exc:
            raise Refused(400, f"{name}: {exc}", "INVALID_FIELD", field=name) from None

    return pages.ActionFilters(
        session=_session_filter(query),
        outcome=pick("outcome", pages.OUTCOMES),
        phase=pick("phase", pages.PHASES),
        code=pick("code", ["OK", *pages.CODES]),
        since=when("since"),
        until=when("until"),
    )
