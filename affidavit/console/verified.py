"""The journal page's verify, kept instead of run whole on every request (issue 15: the page ran
``JournalReader.verify`` -- every row, checkpoint, stored result and binding -- per request).

A whole verify runs when nothing is kept, and when the operator asks for one (the page's
"verify the whole journal" button).  Every other request extends the last intact report to the
journal's head (``JournalReader.verify_since``): the rows appended since -- their links, hashes,
checkpoints and the results they commit, not the idempotency keys they bind nor their lease
rows -- are checked as
a whole verify checks them, continuing the chain from the row the report reached, which the
chain makes sound for those rows; the page's verdict says what was not checked.  It does not
read again what it checked before: a row altered in place before that point, a stored result,
an idempotency binding or a lease row changed since, is found by the next whole verify only.
So the page says both: when the whole verify ran and how far it reached, and how far the rows
after it were checked since, and when -- and from which row the last request read: each
extension continues the last one's, so a row an earlier request checked is not read again
either (the page says the rows before that one are as of their check).

When the report cannot be extended -- the row it reached is gone or another (the journal was
replaced, rewound or re-chained: another broker of a shared journal cannot do that, only
someone writing the database), or the recorded keys changed -- a whole verify runs.  A broken
whole verify is kept as it is (with when it ran) until the operator verifies again, and the
kept views (``SessionSummary``) fold the whole journal again at their next request -- reading
the altered row as a full fold does: it is not read past, nor forgotten; rows after an intact
report that do not check are read again from that report on each request (a problem stays
reported while it is there).

A request that is no whole verify does not wait for one that runs (~41 s at 1M events): it is
answered at once with the last answer given and since when the whole verify runs (``running``)
-- a thread is not held per request for its length, nor when it waited for an extension's turn
and a whole verify took the lock first.  An operator's press marks the whole verify running
(``begin``, which decides start or join) before it is answered, and the verify runs in the
background; one that could not read the journal is kept as failed (``failed``: its code and
words) until the next whole verify ends.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from affidavit.engine import read_failure
from affidavit.journal import JournalError, JournalReader, SessionSummary, VerifyReport

__all__ = ["KeptVerify"]

_LOOK = 0.05
"""Seconds a visit waits for the lock before it looks again whether a whole verify runs."""


@dataclasses.dataclass(frozen=True)
class _Whole:
    report: VerifyReport
    at: float
    started: float
    """When it began reading: it proves the rows through ``report.count`` as they were then
    (``JournalReader.verify`` reads one snapshot), not as they are at ``at``."""


class KeptVerify:
    """One per console; the threads that read it take turns."""

    def __init__(
        self, summary: SessionSummary | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self._summary = summary
        """The kept views (``SessionSummary``): told of each whole verify (their answers say
        when it completed and its verdict); one that finds a row altered makes it fold the
        journal again (it does not read again a row it folded before)."""
        self._lock = threading.Lock()
        self._clock = clock
        self._whole: _Whole | None = None
        self._base: VerifyReport | None = None
        """The last intact report (whole or extended): what the next request extends."""
        self._started = 0
        """Whole verifies begun (under the lock; read without it, an int: a request's mark)."""
        self._answered = 0
        """The number (``_started``) of the last whole verify that answered."""
        self._shown: tuple[VerifyReport, float, int] | None = None
        """The report shown, when it was made, and the last row it did not read again (the
        rows through it were checked by the whole verify or an earlier extension)."""
        self._guard = threading.Lock()
        """Held a moment: decides whether a press starts a whole verify or joins one."""
        self._running: float | None = None
        """When the whole verify that runs began (set under ``_guard``; read without it)."""
        self._failure: dict[str, Any] | None = None
        """The last whole verify that did not read (its code, message, when), until the next
        one ends."""
        self._last: dict[str, Any] | None = None
        """The last answer given (one attribute: read whole without the lock)."""

    @property
    def running(self) -> float | None:
        """When the whole verify that runs began; None when none runs."""
        return self._running

    def begin(self) -> bool:
        """An operator's press: True when it starts a whole verify (``running`` is marked now,
        before the press is answered: the page it is sent to says so even before the verify's
        thread has begun), False when one runs already (the press joins it).  Its run is
        ``page(reader, whole=True)``, in the background; ``failed`` when that did not read."""
        with self._guard:
            if self._running is not None:
                return False
            self._running = self._clock()
            return True

    def failed(self, code: str, message: str) -> None:
        """The whole verify begun did not read the journal (it could not be opened, the read
        failed): shown with its code until the next whole verify ends; nothing else kept."""
        with self._guard:
            started, self._running = self._running, None
            if started is not None:
                self._failure = {
                    "code": code,
                    "message": message,
                    "started_at": started,
                    "at": self._clock(),
                }

    def page(self, reader: JournalReader, whole: bool = False) -> dict[str, Any]:
        """The report to show, the whole verify's (``started_at``, ``at`` it finished,
        ``through``) and when the rows after it were last checked (``checked_at``,
        ``checked_through``) and through which row they were not read this time
        (``unread_through``: an extension reads only the rows after the last one an earlier
        request checked); None when the shown report is the whole verify's own.  ``running``:
        when the whole verify that runs began -- a request that is no whole verify is answered
        with the last answer (``report`` None before the first), never held for it: not when it
        finds the lock held by an extension that a whole verify then takes either (it looks
        again every ``_LOOK`` seconds whether one runs); None when none runs.  ``failure``: the
        last whole verify that did not read."""
        asked = self._started
        if whole:
            self._lock.acquire()
        else:
            while not self._lock.acquire(timeout=_LOOK):
                if self._running is not None:
                    return self._waiting()
            if self._running is not None:  # begun, its thread not yet here: not waited for
                self._lock.release()
                return self._waiting()
        try:
            self._last = answer = self._answer(reader, whole, asked)
            return answer
        finally:
            self._lock.release()

    def _waiting(self) -> dict[str, Any]:
        """The last answer given, since when the whole verify runs, and the last failure."""
        return {**(self._last or _NOTHING), "running": self._running, "failure": self._failure}

    def _answer(self, reader: JournalReader, whole: bool, asked: int) -> dict[str, Any]:
        if whole and self._answered > asked:
            # A whole verify began after this request came (they take turns: it waited for
            # it): it read the journal as this one would, so it answers both -- presses
            # queued while one runs cost one more, not one each.
            return self._view()
        if not whole and self._whole is not None:
            if self._base is None:  # the last report was broken: kept, not read past
                return self._view()
            unread = self._base.count  # checked by an earlier request: not read again
            extended = reader.verify_since(self._base)
            if extended is not None:
                self._keep(extended, unread)
                return self._view()
        self._started += 1
        with self._guard:  # (marked by ``begin`` when an operator's press began it)
            if self._running is None:
                self._running = self._clock()
            started = self._running
        try:
            report = reader.verify()  # (raises: the journal was not read; nothing kept)
        except JournalError as exc:
            _, code, message = read_failure(exc, "the whole journal verify")
            self.failed(code, message)
            raise
        except BaseException:
            self.failed("CONSOLE_FAILED", "the console failed; see its log")
            raise
        self._answered = self._started
        at = self._clock()
        self._whole, self._shown = _Whole(report, at, started), (report, at, report.count)
        self._base = report if report.ok else None
        with self._guard:
            self._running, self._failure = None, None
        if self._summary is not None:  # the kept views say when; broken: they read it all again
            self._summary.verified(at, report.count, report.ok, started=started)
        return self._view()

    def _keep(self, report: VerifyReport, unread: int) -> None:
        self._shown = (report, self._clock(), unread)
        if report.ok:  # (broken: the next request reads again from the last intact row)
            self._base = report

    def _view(self) -> dict[str, Any]:
        assert self._whole is not None and self._shown is not None
        whole, (shown, at, unread) = self._whole, self._shown
        since = shown is not whole.report
        return {
            "report": dataclasses.asdict(shown),
            "whole": {
                "at": whole.at,
                "started_at": whole.started,
                "through": whole.report.count,
                "ok": whole.report.ok,
                "results": whole.report.results,
                "results_marker_only": whole.report.results_marker_only,
            },
            "checked_at": at if since else None,
            "checked_through": shown.count if since else None,
            "unread_through": unread if since else None,
            "running": None,
            "failure": self._failure,
        }


_NOTHING: dict[str, Any] = {
    "report": None,
    "whole": None,
    "checked_at": None,
    "checked_through": None,
    "unread_through": None,
    "failure": None,
}
"""What is shown while the first whole verify runs: no report yet."""
