"""A journal whose rows someone altered in place reads as altered, on every reading surface.

Someone who can write the SQLite file (and holds no key) changes one cell of one row -- an
event's attrs to malformed JSON or JSON of another shape, its kind or source to a word the
broker never wrote, a sealed payload to random bytes, a seq to an odd value, a results,
checkpoint, lease, idempotency or meta row to garbage.  Every read must then either succeed or
raise a ``JournalError`` (the CLI: one line, a non-zero exit) -- never a raw ``KeyError``,
``ValueError``, ``TypeError``, ``json.JSONDecodeError``, ``UnicodeDecodeError`` or a traceback.
The writing journal, opened on such a file, refuses the same way.

Property-style and bounded: a small journal is built once; each example alters one cell of a
private copy of it and reads it through every surface.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import affidavit.cli
from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalError, JournalReader, LeaseBusy
from affidavit.statemachine import Event, ImpossibleEvent
from affidavit.statemachine import EventKind as E

from .helpers import FINGERPRINT, accepted, fill_results

BODY = bytes(range(256)) * 300  # two 64 KiB chunks (the last one short)
SECRET = {"token": "canary-7f3a9c1e-SECRET-do-not-store"}

# table -> the columns someone may alter (every column a read hands back)
COLUMNS: dict[str, tuple[str, ...]] = {
    "events": (
        "seq",
        "at",
        "invocation_id",
        "session_id",
        "kind",
        "source",
        "observer",
        "observer_seq",
        "attrs",
        "attrs",  # twice: the column most worth altering
        "payload",
        "audit",
        "prev_hash",
        "hash",
    ),
    "results": ("invocation_id", "seq", "sha256", "streams", "streams", "summary"),
    "result_chunks": ("invocation_id", "stream", "idx", "data"),
    "checkpoints": ("seq", "hash", "prev", "at", "adopted", "key_id", "signature"),
    "leases": ("invocation_id", "holder", "generation", "expires_at", "seq"),
    "idempotency": ("scope", "key", "fingerprint", "invocation_id", "expires_at", "created_at"),
    "meta": ("value",),
    "invocations": ("first_seq", "invocation_id"),
}
JSON_COLUMNS = {("events", "attrs"), ("results", "streams")}

# (sql expression, parameters): what the cell becomes
Value = tuple[str, tuple[Any, ...]]

_JSON_GARBAGE = st.sampled_from(
    [
        "",
        "{",
        '{"a":',
        "not json",
        "[]",
        "[1, 2]",
        "1",
        "-1",
        '"text"',
        "null",
        "true",
        "{}",
        "NaN",
        "1e999",
        '{"a": 1} trailing',
        " {} ",
        '{"operation": 1}',
        '{"operation": {"budget": "x"}}',
        '{"status": "x", "outcome": 7}',
        '{"body": []}',
        '{"body": {"chunks": "x"}}',
        '{"body": {"chunks": -1, "bytes": "x", "sha256": 1}}',
        "\x00",
    ]
)
_WORDS = st.sampled_from(
    [
        "NOT_A_KIND",
        "ACTION_ACCEPTED",
        "RESULT_COMMITTED",
        "REMOTE_RESPONSE",
        "remote_response",
        "broker",
        "operator_attested",
        "body",
        "inv-r",
        "inv-u",
        "",
        "key_id",
    ]
)
_JSON_VALUES = st.sampled_from(
    [None, "x", "", 1, -1, 0, 2**63, 1.5e300, True, [], {}, [1], {"a": None}]
)

VALUES: st.SearchStrategy[Value] = st.one_of(
    _JSON_GARBAGE.map(lambda s: ("?", (s,))),
    _WORDS.map(lambda s: ("?", (s,))),
    st.text(max_size=12).map(lambda s: ("?", (s,))),
    st.binary(max_size=48).map(lambda b: ("?", (b,))),
    # text that is not UTF-8
    st.binary(min_size=1, max_size=8).map(lambda b: ("CAST(? AS TEXT)", (b"\xff" + b,))),
    st.sampled_from([-(2**63), -1, 0, 1, 2, 3, 10**6, 2**62, 2**63 - 1]).map(lambda n: ("?", (n,))),
    st.sampled_from([-1.5, 0.5, 1e300, -0.0]).map(lambda f: ("?", (f,))),
    st.just(("NULL", ())),
)


@dataclass(frozen=True)
class Alteration:
    table: str
    column: str
    row: int
    """Index into the table's rows (modulo their number)."""
    value: Value | None
    """None: a JSON column's value re-written with ``path`` set to ``json_value``."""
    path: int = 0
    json_value: Any = None


@st.composite
def alterations(draw: st.DrawFn) -> Alteration:
    table = draw(st.sampled_from(sorted(COLUMNS)))
    column = draw(st.sampled_from(COLUMNS[table]))
    row = draw(st.integers(0, 63))
    if (table, column) in JSON_COLUMNS and draw(st.booleans()):
        return Alteration(table, column, row, None, draw(st.integers(0, 15)), draw(_JSON_VALUES))
    return Alteration(table, column, row, draw(VALUES))


def _row_key(conn: sqlite3.Connection, table: str) -> str:
    """What names a row of ``table``: its rowid, or a WITHOUT ROWID table's key columns
    (``result_chunks`` from schema 8 on)."""
    (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    if not str(sql).rstrip().upper().endswith("WITHOUT ROWID"):
        return "rowid"
    columns = conn.execute(
        "SELECT name FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk", (table,)
    ).fetchall()
    return ", ".join(str(c) for (c,) in columns)


def _reshaped(text: str, path: int, value: Any) -> str:
    """``text`` (a JSON object) with one of its members, or a member's member, set to
    ``value`` (or removed, for ``...``)."""
    obj = json.loads(text)
    slots: list[tuple[dict[str, Any], str]] = []

    def walk(o: Any) -> None:
        if isinstance(o, dict):
            for k, v in o.items():
                slots.append((o, k))
                walk(v)

    walk(obj)
    if not slots:
        return json.dumps(value)
    parent, key = slots[path % len(slots)]
    if path // len(slots) % 2:
        del parent[key]
    else:
        parent[key] = value
    return json.dumps(obj)


def alter(db: Path, a: Alteration) -> bool:
    """Apply ``a`` as someone with write access and no key would (the append-only triggers
    dropped first); False if SQLite refuses it (a NOT NULL or CHECK constraint, a duplicate
    key) -- nothing to read then."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger'"
        ).fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        key = _row_key(conn, a.table)
        where = f"({key}) = ({', '.join('?' * (key.count(',') + 1))})"
        keys = conn.execute(f"SELECT {key} FROM {a.table} ORDER BY {key}").fetchall()
        if not keys:
            return False
        row = keys[a.row % len(keys)]
        if a.value is None:
            (old,) = conn.execute(f"SELECT {a.column} FROM {a.table} WHERE {where}", row).fetchone()
            expr, params = "?", (_reshaped(old, a.path, a.json_value),)
        else:
            expr, params = a.value
        conn.execute(f"UPDATE {a.table} SET {a.column} = {expr} WHERE {where}", (*params, *row))
        return True
    except sqlite3.IntegrityError:
        return False
    finally:
        conn.close()


# -- the journal --------------------------------------------------------------------------------

INVOCATIONS = ("inv-r", "inv-u", "inv-z", "inv-p")


async def _fill(db: Path) -> None:
    async with Journal.open(db) as j:
        await fill_results(j, BODY)
        await j.acquire_lease("inv-u", "worker-1", 60.0)
        await j.bind_idempotency("sess-1", "idem-1", FINGERPRINT, "inv-p", None)
        await j.append(accepted("inv-p", idem=("sess-1", "idem-1")), payload=SECRET)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("altered") / "j.db"
    trio.run(_fill, db)
    return db


def _copy(src: Path, to: Path) -> Path:
    """``src`` (and its key files) copied to the directory ``to``."""
    db = to / "j.db"
    a, b = sqlite3.connect(src), sqlite3.connect(db)
    with a, b:
        a.backup(b)
    a.close()
    b.close()
    os.chmod(db, 0o600)  # private, as the broker makes one: else every opener warns of it
    for suffix in (".key", ".signing.key"):
        shutil.copy2(f"{src}{suffix}", f"{db}{suffix}")
    return db


@contextlib.contextmanager
def altered_copy(base: Path, a: Alteration) -> Iterator[Path | None]:
    """A private copy of ``base`` with ``a`` applied; None if SQLite refused the alteration."""
    with tempfile.TemporaryDirectory() as d:
        db = _copy(base, Path(d))
        yield db if alter(db, a) else None


@pytest.fixture(scope="module", autouse=True)
def _one_parser_per_command() -> Iterator[None]:
    """The CLI surfaces run ``affidavit.cli.main`` in process ~900 times a property, and each
    run built its command's argparse parser again (~35 ms: half the property's time) -- the
    same parser whatever the journal holds, so here it is built once per command and reused
    (``parse_args`` keeps nothing between two parses: each gets a namespace of its own).  The
    processes of ``test_the_cli_prints_one_line_and_no_traceback`` build theirs as always."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(affidavit.cli, "build_parser", functools.cache(affidavit.cli.build_parser))
        yield


# -- the surfaces -------------------------------------------------------------------------------


def _escapes(
    surfaces: dict[str, Callable[[], object]], allowed: tuple[type[Exception], ...] = ()
) -> list[str]:
    """Each surface run; what it raised that is not a ``JournalError`` (or ``allowed``)."""
    out = []
    for name, fn in surfaces.items():
        try:
            fn()
        except (JournalError, *allowed) as exc:
            assert SECRET["token"] not in str(exc)
        except Exception as exc:  # what the test looks for
            out.append(f"{name}: {type(exc).__name__}: {exc}")
    return out


def _bound_record(r: JournalReader) -> object:
    binding = r.find_idempotency("sess-1", "idem-1")
    return None if binding is None else r.bound_record(binding)


def _reader_surfaces(db: Path) -> dict[str, Callable[[], object]]:
    def with_reader(fn: Callable[[JournalReader], object]) -> Callable[[], object]:
        def run() -> object:
            with JournalReader.open(db) as r:
                return fn(r)

        return run

    def payloads(r: JournalReader) -> None:
        # Every row's seq as stored, and the seqs up to the head: an altered seq may be huge
        # (1..head then never ends), and a removed row leaves a gap worth reading too.
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            stored = {s for (s,) in conn.execute("SELECT seq FROM events") if type(s) is int}
        finally:
            conn.close()
        for seq in sorted(stored | set(range(1, min(r.head()[0], len(stored) + 2) + 1))):
            r.payload(seq)

    def stream(r: JournalReader) -> None:
        s = r.result_stream("inv-r")
        if s is not None:
            for name in s.streams:
                for _ in s.chunks(name):
                    pass

    surfaces: dict[str, Callable[[], object]] = {
        "verify": with_reader(lambda r: r.verify()),
        "verify --accept-unsigned": with_reader(lambda r: r.verify(accept_unsigned=True)),
        "anchor": with_reader(lambda r: r.anchor()),
        "head": with_reader(lambda r: r.head()),
        "latest_checkpoint": with_reader(lambda r: r.latest_checkpoint()),
        "list_actions": with_reader(lambda r: r.list_actions()),
        "iter_actions": with_reader(lambda r: list(r.iter_actions())),
        "sessions": with_reader(lambda r: r.sessions()),
        "read_result": with_reader(lambda r: r.read_result("inv-r")),
        "read_result from 1": with_reader(lambda r: r.read_result("inv-r", from_chunk=1)),
        "result_stream": with_reader(stream),
        "payload": with_reader(payloads),
        "find_idempotency": with_reader(lambda r: r.find_idempotency("sess-1", "idem-1")),
        "bound_record": with_reader(_bound_record),
    }
    for iid in INVOCATIONS:
        surfaces[f"events {iid}"] = with_reader(lambda r, i=iid: r.events(i))  # type: ignore[misc]
        surfaces[f"record {iid}"] = with_reader(lambda r, i=iid: r.record(i))  # type: ignore[misc]
        surfaces[f"lease {iid}"] = with_reader(lambda r, i=iid: r.lease(i))  # type: ignore[misc]
    return surfaces


def _cli(argv: list[str]) -> Callable[[], object]:
    def run() -> object:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(argv)
        text = err.getvalue()
        assert "Traceback" not in text, text
        assert SECRET["token"] not in text + out.getvalue()
        if code == 2:  # the one-line refusal of an unreadable journal
            assert text.startswith("affidavit: ") and text.count("\n") == 1, text
        return code

    return run


def _cli_surfaces(db: Path) -> dict[str, Callable[[], object]]:
    j = ["--journal", str(db)]
    surfaces = {
        "cli journal verify": _cli(["journal", "verify", *j]),
        "cli journal verify --json": _cli(["journal", "verify", "--json", *j]),
        "cli actions": _cli(["actions", *j]),
        "cli actions --json": _cli(["actions", "--json", *j]),
        "cli sessions": _cli(["sessions", *j]),
    }
    for iid in INVOCATIONS:
        surfaces[f"cli record {iid}"] = _cli(["record", iid, *j])
        surfaces[f"cli record {iid} --json"] = _cli(["record", iid, "--json", *j])
    return surfaces


def _writer_surfaces(db: Path) -> dict[str, Callable[[], object]]:
    def run(fn: Callable[[Journal], Any]) -> Callable[[], object]:
        def each() -> None:
            # A copy of its own per surface: the writes of one do not meet the next.
            with tempfile.TemporaryDirectory() as d:
                trio.run(go, _copy(db, Path(d)))

        async def go(path: Path) -> None:
            async with Journal.open(path) as j:
                await fn(j)

        return each

    async def lease(j: Journal) -> None:
        # The lease row is read and judged: live, it is busy to its own holder too.
        with contextlib.suppress(LeaseBusy):
            await j.acquire_lease("inv-u", "worker-1", 60.0)

    async def records(j: Journal) -> None:
        for iid in INVOCATIONS:
            j.record(iid)

    return {
        "Journal.open": run(lambda j: trio.sleep(0)),
        "append a new invocation": run(lambda j: j.append(accepted("inv-new"))),
        "append to inv-z": run(lambda j: j.append(Event(E.RESULT_COMMITTED, "inv-z"))),
        "acquire_lease inv-u": run(lease),
        "bind_idempotency": run(
            lambda j: j.bind_idempotency("sess-1", "idem-1", FINGERPRINT, "inv-p", None)
        ),
        "writer record": run(records),
    }


PROPERTY = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

# Each alteration that escaped as a raw exception before (kept as examples, so every run
# checks them whatever the property draws).  Rows: 0..6 inv-r up to its response, 7 its
# RESULT_COMMITTED, 21 inv-p's ACTION_ACCEPTED (the sealed payload).
FOUND = [
    Alteration("events", "attrs", 7, ("?", ("",))),  # JSONDecodeError
    Alteration("events", "attrs", 20, ("?", (b"\x00\x01",))),  # TypeError: a blob
    Alteration("events", "attrs", 3, ("?", ("[]",))),  # AttributeError in a rule
    Alteration("events", "attrs", 0, None, 0, "x"),  # ImpossibleEvent: operation is "x"
    Alteration("events", "attrs", 0, ("?", (0,))),  # AttributeError in a rule: attrs 0
    Alteration("events", "kind", 3, ("?", ("null",))),  # KeyError
    Alteration("events", "source", 3, ("?", ("{",))),  # KeyError
    Alteration("events", "at", 0, ("?", ("",))),  # TypeError in sessions, CLI record
    Alteration("events", "observer", 7, ("?", (b"\x00\x01",))),  # TypeError: CLI --json
    Alteration("events", "invocation_id", 1, ("?", ("",))),  # ImpossibleEvent
    Alteration("events", "invocation_id", 19, ("?", ("",))),  # inv-z's row moved out of it
    Alteration("events", "payload", 21, ("?", ("1",))),  # TypeError
    Alteration("events", "payload", 21, ("?", (-1,))),  # ValueError
    Alteration("results", "seq", 0, ("?", ("[]",))),  # TypeError in verify
    Alteration("results", "seq", 0, ("CAST(? AS TEXT)", (b"\xff\xfe",))),  # UnicodeEncodeError
    Alteration("leases", "expires_at", 0, ("?", ("{",))),  # TypeError taking the lease
    Alteration("leases", "generation", 0, ("?", ("{",))),  # TypeError taking the lease
    Alteration("checkpoints", "prev", 0, ("?", ("1e999",))),  # OverflowError: int(inf)
    Alteration("checkpoints", "at", 0, ("?", ("1e999",))),  # (a float: inf reads as altered)
    Alteration("events", "at", 0, ("?", ("1e999",))),  # OverflowError: the CLI's time of it
]


def _examples(test: Callable[..., None]) -> Callable[..., None]:
    for a in reversed(FOUND):
        test = example(a=a)(test)
    return test


def test_the_untouched_journal_reads_everywhere(base: Path) -> None:
    """The surfaces the properties run, on the journal before any alteration: each succeeds
    (so an alteration is what makes one refuse)."""
    with JournalReader.open(base) as r:
        assert r.verify().ok
        assert r.read_result("inv-r") is not None
        assert r.lease("inv-u") is not None
        assert r.find_idempotency("sess-1", "idem-1") is not None
        assert r.payload(r.head()[0]) == SECRET
    for fn in _reader_surfaces(base).values():
        fn()
    for name, fn in _cli_surfaces(base).items():
        assert fn() == 0, name
    for fn in _writer_surfaces(base).values():
        fn()


@PROPERTY
@_examples
@given(a=alterations())
def test_an_altered_row_reads_as_altered(base: Path, a: Alteration) -> None:
    with altered_copy(base, a) as db:
        if db is None:
            return
        assert _escapes({**_reader_surfaces(db), **_cli_surfaces(db)}) == []


@PROPERTY
@_examples
@given(a=alterations())
def test_the_writing_journal_refuses_an_altered_file(base: Path, a: Alteration) -> None:
    # One alteration the writer cannot tell from a journal it wrote: a row moved out of its
    # invocation (its invocation_id changed) leaves that invocation a shorter, well-formed
    # history, and a new event that history cannot take is refused as it would be on an
    # intact journal (ImpossibleEvent, a defined refusal, not a crash).  The chain shows the
    # move -- `journal verify`, an anchor -- without the writer re-verifying it at each append.
    moved = a.table == "events" and a.column == "invocation_id"
    with altered_copy(base, a) as db:
        if db is None:
            return
        assert _escapes(_writer_surfaces(db), (ImpossibleEvent,) if moved else ()) == []
        if moved:
            with JournalReader.open(db) as r:
                assert not r.verify().ok


@pytest.mark.parametrize("a", [FOUND[0], FOUND[5]], ids=["attrs", "kind"])
def test_the_cli_prints_one_line_and_no_traceback(base: Path, a: Alteration) -> None:
    """As a process: stderr holds the one line and nothing else -- no traceback, and no
    "Exception ignored" from a row cursor closed after its connection."""
    with altered_copy(base, a) as db:
        assert db is not None
        for args in (["record", "inv-r"], ["actions", "--json"], ["sessions"]):
            p = subprocess.run(
                [sys.executable, "-m", "affidavit", *args, "--journal", str(db)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert p.returncode == 2, (args, p.stderr)
            assert (
                p.stderr.startswith("affidavit: JOURNAL_UNREADABLE: journal ")
                and p.stderr.count("\n") == 1
            )
            assert "was altered" in p.stderr, p.stderr
