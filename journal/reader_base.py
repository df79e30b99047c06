"""The ground every read of the journal stands on (``reader.py``'s ``JournalReader`` is built on
it): the reader's connection, a read tried again once when a shared database's connection was
lost (then ``JournalUnavailable``), the errors a read raises -- naming what it read, never a
payload, a key or a result -- and the clock a read judges deadlines by (``ReaderBase.now``).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from affidavit.statemachine import Record, key_moment, within_send_window

from . import checkpoints
from .backend import Backend, open_backend
from .boot import boot_elapsed
from .errors import JournalError, JournalUnavailable, ReadFailed
from .names import beside, refuse_left_beside
from .rows import AlteredRow
from .sealing import BrokerKey
from .signing import key_id_of
from .tables import Tables

__all__ = ["ReaderBase", "pinned_keys"]

T = TypeVar("T")


def default_key_file(path: Path) -> Path:
    """Where the broker key lives unless configured: ``<journal>.key`` beside the file ``path``
    names (``names.beside``)."""
    return beside(path, ".key")


class ReaderBase:
    """A reader's connection, its reads and its clock; the keys it was given.  ``path`` is a
    SQLite file or a ``postgresql://`` URL (``where`` names it in messages, without a
    password)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        key_file: str | os.PathLike[str] | None = None,
        readonly: bool = True,
        clock: Callable[[], float] = time.time,
        backend: Backend | None = None,
        public_keys: Sequence[bytes] = (),
        lock_wait: float | None = None,
    ) -> None:
        self.backend = backend if backend is not None else open_backend(path)
        self.path = self.backend.path
        """The SQLite file (None for a database)."""
        self.where = self.backend.where
        self._clock = clock
        if key_file is not None:
            self._key_file: Path | None = Path(key_file)
        else:
            self._key_file = default_key_file(self.path) if self.path is not None else None
        if self.path is not None and self._key_file is not None:  # (``path``: the name given)
            refuse_left_beside(path, ".key", "sealing key", self._key_file)
        self._key: BrokerKey | None = None
        self._key_recorded = False
        """The key's id is the one the journal records: a blob it cannot open was altered."""
        self._known_checkpoints: checkpoints.Known = {}
        """Checkpoints found valid (or signed by this process), whole, by seq."""
        self._recorded: dict[str, bytes] | None = None
        self._pinned = pinned_keys(None, public_keys)
        """Signing keys given by the caller (kept apart from the journal): reads check
        checkpoints with these, never with the keys the journal records."""
        self._streams: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()
        """Views streamed from this reader and not yet finished (``iter_actions``): closed by
        ``close`` while the connection is still open."""
        self.send_windows: Mapping[str, float] | None = None
        """By target, the lease a same-key retry would take now -- its default timeout plus the
        current ``[service] lease_margin`` (``affidavit.config.send_windows``); a target not
        in it (gone from the config) is judged by its record alone, and so is every record of
        a reader that knows no config (None).  Every record read here judges its key-bound
        hints by it (``within_send_window``): a ``lease_margin`` raised since a record was
        accepted makes the retry's lease longer than the ``send_window`` the record holds, and
        the lease check (``leases.acquire_op``) refuses what the hint would still invite."""
        self._role = "tool" if readonly else "reader"
        """The connection's kind, kept when a lost one is replaced (``_read``): a read-only
        reader's has no statement timeout (a view's long scan is its right), the writing
        journal's own reader's has one."""
        self._lock_wait = lock_wait
        """Seconds a read waits at most for a lock another session holds (``bound_waits``; a
        view's), then the database declines it (``ReadFailed``); None: the connection's own."""
        self._rconn: Any = None
        self._rconn = self._connect()
        self.tables = self.backend.tables(self._rconn)

    def _connect(self) -> Any:
        conn = self.backend.connect(self._role)
        if self._lock_wait is not None:
            try:
                self.backend.bound_waits(conn, self._lock_wait)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.backend.close(conn)
                raise
        return conn

    def close(self) -> None:
        # A stream its consumer left part-way (``affidavit actions | head``: the write failed)
        # still holds an open statement; closed later, by the collector, it would find the
        # connection closed ("Exception ignored ... Cannot operate on a closed database").
        for stream in list(self._streams):
            with contextlib.suppress(Exception):
                stream.close()
        if self._rconn is not None:
            with contextlib.suppress(Exception):
                self.backend.close(self._rconn)

    def fresh(self) -> bool:
        """Whether what opening this reader checked still holds (``Backend.unchanged``: the
        same file, the same schema), cheaply -- an idle reader taken again; False: open a new
        one, as its checks then say what is wrong."""
        return self._rconn is not None and self.backend.unchanged(self._rconn)

    def reset(self) -> None:
        """This reader as if just opened, for another read on the same connection (the
        broker's idle view readers): the streams a read left closed, a transaction it left
        open ended, and what it learned dropped -- ``send_windows``, the broker key, the
        checkpoints found valid, the keys the journal recorded -- so the next read proves what
        it shows from the records as they are then, as a new reader would.  A database error
        is raised as the backend's (its owner closes the reader instead of keeping it)."""
        for stream in list(self._streams):
            stream.close()
        self.backend.rollback(self._rconn)
        self.tables = self.backend.tables(self._rconn)
        self.send_windows = None
        self._key = None
        self._key_recorded = False
        self._known_checkpoints = {}
        self._recorded = None

    # -- reading, with a lost connection tried again once -------------------------------------
    # (then ``JournalUnavailable``: an async caller may wait and read again -- ``Recorder``)

    def _read(self, fn: Callable[[Tables], T], what: str) -> T:
        """``fn`` over the tables; ``what`` names what it reads, in messages (``the events of
        invocation act_...``): never a payload, a key or a result."""
        backend = self.backend
        try:
            return fn(self.tables)
        except AlteredRow as exc:  # a row the broker did not write: reading it again won't help
            raise self._altered(what, exc) from None
        except backend.errors as exc:
            if not backend.lost(exc):
                raise self._error(what, exc) from None
        with contextlib.suppress(Exception):
            backend.close(self._rconn)
        try:
            self._rconn = self._connect()
        except JournalUnavailable as exc:  # no new connection: the database is still away
            raise JournalUnavailable(f"{what} cannot be read: {exc}") from None
        except JournalError as exc:  # a server that answers and refuses: not away
            raise JournalError(f"{what} cannot be read: {exc}") from None
        try:
            self.tables = backend.tables(self._rconn)
            return fn(self.tables)
        except backend.errors as exc:
            if backend.lost(exc):
                raise JournalUnavailable(str(self._error(what, exc))) from None
            raise self._error(what, exc) from None

    def _altered(self, what: str, exc: AlteredRow) -> AlteredRow:
        # Still an ``AlteredRow``: every surface answers it as the journal's fault
        # (JOURNAL_UNREADABLE), never as a stored result that failed its verification.
        return AlteredRow(f"journal {self.where}: {what} cannot be read: {exc}")

    def _error(self, what: str, exc: BaseException) -> JournalError:
        """A database error on a connection that is not lost: ``ReadFailed`` when the database
        only declined this once (``Backend.transient``), else a plain ``JournalError``."""
        cls = ReadFailed if self.backend.transient(exc) else JournalError
        return cls(f"journal {self.where}: {what} cannot be read: {self.backend.describe(exc)}")

    def guarded(self, what: str) -> _Guard:
        """``results.Store``: a database error inside is a ``JournalError`` naming ``what`` (a
        stored row the database cannot hand back -- a text column that is not UTF-8 -- is one,
        like any other altered row)."""
        return _Guard(self, what)

    def snapshot(self) -> contextlib.AbstractContextManager[None]:
        """``results.Store``: one read transaction."""
        return self.backend.snapshot(self._rconn)

    def database_now(self, purpose: str | None = None) -> float | None:
        """Now by the clock a shared journal records and judges deadlines in -- the database's
        ``clock_timestamp()`` (``Tables.lease_now``) -- read outside any transaction; None
        where the journal has no clock of its own (SQLite: one host, the broker's clock).  A
        same-key retry is decided by it (a key's retention is recorded in that time), and
        decided again inside the transaction that takes its lease (``leases.acquire_op``).
        ``purpose``: the read it is for, named in an error (``the actions view``)."""
        what = "the database's clock" if purpose is None else f"the database's clock for {purpose}"
        return self._read(lambda t: t.lease_now(), what)

    def now(self, purpose: str | None = None) -> float:
        """Now by the clock this journal records and judges deadlines in -- a key's retention
        (a retry hint), an approval's expiry, a binding's age, a lease's end: the database's
        on a shared journal (``database_now``: a read, which may raise ``JournalError``), else
        this reader's clock (SQLite: one host, the broker's own).  The one place that choice
        is made outside a transaction; inside the writer's, ``leases.lease_now`` makes it.
        By each broker's own clock instead, a host running ahead (or behind) judged deadlines
        another broker recorded in the database's time.  ``purpose``: as ``database_now``."""
        shared = self.database_now(purpose)
        return self._clock() if shared is None else shared

    def current(self, record: Record, now: float) -> Record:
        """``record`` with its key-bound hints judged by the lease a retry would take now
        (``send_windows``), at the key's moment (``key_moment``: ``now``, or later by the boot
        clock its binding recorded -- a wall clock stepped back re-opens no retention; before
        the binding, none is left): the record itself when nothing is known of it."""
        idem = record.idempotency
        if idem is None:
            return record
        windows = self.send_windows
        target = record.target
        window = None if windows is None or target is None else windows.get(target)
        moment = key_moment(idem, now, boot_elapsed(idem.get("boot")))
        if window is None and moment <= now:
            return record
        return within_send_window(record, now, 0.0 if window is None else window, moment)

    def _now(self, now: float | None, purpose: str) -> float:
        """When a read computes its records' retry hints: ``now`` if the caller gives its
        clock, else ``self.now`` at read time -- never the time of a record's last event,
        which would keep a hint as permissive as it was then (a same-key resend after the
        remote forgot the key)."""
        return self.now(purpose) if now is None else now


class _Guard:
    """``ReaderBase.guarded``: never swallows; converts the backend's errors."""

    __slots__ = ("reader", "what")

    def __init__(self, reader: ReaderBase, what: str) -> None:
        self.reader = reader
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        reader = self.reader
        if exc is not None and isinstance(exc, reader.backend.errors):
            with contextlib.suppress(Exception):
                reader.backend.rollback(reader._rconn)
            error = reader._error(self.what, exc)
            if reader.backend.lost(exc):  # the database gone: away, not altered (as ``_read``)
                raise JournalUnavailable(str(error)) from None
            raise error from None


def pinned_keys(one: bytes | None, more: Sequence[bytes]) -> dict[str, bytes]:
    """Raw Ed25519 public keys by key id."""
    raws = ([one] if one is not None else []) + list(more)
    return {key_id_of(raw): raw for raw in raws}
