"""Hash chain and tamper detection (issue 3: "editing, deleting or swapping any row ... makes
`journal verify` fail at that row")."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.cli import main as cli_main
from affidavit.journal import GENESIS, Journal, JournalError, JournalReader
from affidavit.journal.chain import row_hash

from .helpers import happy, interrupted

N_INVOCATIONS = 3


def _build(path: Path) -> int:
    async def fill() -> int:
        async with Journal.open(path) as j:
            n = 0
            for i in range(N_INVOCATIONS):
                for ev in happy(f"inv-{i}"):
                    await j.append(ev, payload={"note": f"row of inv-{i}"})
                    n += 1
            return n

    return trio.run(fill)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    path = tmp_path_factory.mktemp("chain") / "j.db"
    count = _build(path)
    return path, count


def _copy(pristine: tuple[Path, int], tmp_path: Path) -> tuple[Path, int]:
    src, count = pristine
    dst = tmp_path / "j.db"
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()
    return dst, count


def _tamper(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    """Edit the file directly, the way an attacker with write access would: first drop the
    append-only triggers, then rewrite rows."""
    conn = sqlite3.connect(path, isolation_level=None)
    for trigger in ("events_no_update", "events_no_delete", "events_extend_chain"):
        conn.execute(f"DROP TRIGGER {trigger}")
    for sql, params in statements:
        conn.execute(sql, params)
    conn.close()


def _verify(path: Path) -> tuple[bool, int | None]:
    with JournalReader.open(path) as r:
        report = r.verify()
    return report.ok, report.first_bad_seq


def test_intact_journal_verifies_and_cli_exits_0_with_the_count(
    pristine: tuple[Path, int], capsys: pytest.CaptureFixture[str]
) -> None:
    path, count = pristine
    with JournalReader.open(path) as r:
        report = r.verify()
    assert report.ok and report.count == count and report.first_bad_seq is None
    assert cli_main(["journal", "verify", "--journal", str(path)]) == 0
    assert f"{count} events" in capsys.readouterr().out


def test_first_row_links_to_genesis(pristine: tuple[Path, int]) -> None:
    path, _ = pristine
    conn = sqlite3.connect(path)
    row = conn.execute("SELECT * FROM events WHERE seq = 1").fetchone()
    conn.close()
    assert row[11] == GENESIS
    assert row[12] == row_hash(GENESIS, *row[:11])


EDITS: dict[str, Callable[[int], tuple[str, tuple[object, ...]]]] = {
    "attrs": lambda s: ("UPDATE events SET attrs = '{\"status\":200}' WHERE seq = ?", (s,)),
    "kind": lambda s: ("UPDATE events SET kind = 'RECONCILED' WHERE seq = ?", (s,)),
    "at": lambda s: ("UPDATE events SET at = at + 1 WHERE seq = ?", (s,)),
    "invocation": lambda s: ("UPDATE events SET invocation_id = 'other' WHERE seq = ?", (s,)),
    "session": lambda s: ("UPDATE events SET session_id = 'evil' WHERE seq = ?", (s,)),
    "source": lambda s: ("UPDATE events SET source = 'operator_attested' WHERE seq = ?", (s,)),
    "payload": lambda s: ("UPDATE events SET payload = x'0102' WHERE seq = ?", (s,)),
    "prev_hash": lambda s: (f"UPDATE events SET prev_hash = '{'f' * 64}' WHERE seq = ?", (s,)),
}


@pytest.mark.parametrize("column", sorted(EDITS))
def test_editing_a_row_fails_verify_at_that_row(
    pristine: tuple[Path, int], tmp_path: Path, column: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = _copy(pristine, tmp_path)
    _tamper(path, EDITS[column](5))
    assert _verify(path) == (False, 5)
    assert cli_main(["journal", "verify", "--journal", str(path)]) == 1
    assert "seq 5" in capsys.readouterr().out


def test_editing_a_row_and_recomputing_its_hash_fails_at_that_row(
    pristine: tuple[Path, int], tmp_path: Path
) -> None:
    # The chain alone would notice only at row 6 (which no longer links); the checkpoint signed
    # over row 5's original hash names row 5 itself (each append here is one transaction).
    path, _ = _copy(pristine, tmp_path)
    conn = sqlite3.connect(path)
    row = list(conn.execute("SELECT * FROM events WHERE seq = 5").fetchone())
    conn.close()
    row[8] = '{"status":500}'
    forged = row_hash(row[11], *row[:11])
    _tamper(path, ("UPDATE events SET attrs = ?, hash = ? WHERE seq = 5", (row[8], forged)))
    assert _verify(path) == (False, 5)


def test_deleting_a_row_fails_at_that_seq(pristine: tuple[Path, int], tmp_path: Path) -> None:
    path, _ = _copy(pristine, tmp_path)
    _tamper(path, ("DELETE FROM events WHERE seq = ?", (7,)))
    assert _verify(path) == (False, 7)


def test_truncating_the_middle_fails_at_the_first_missing_seq(
    pristine: tuple[Path, int], tmp_path: Path
) -> None:
    path, _ = _copy(pristine, tmp_path)
    _tamper(path, ("DELETE FROM events WHERE seq BETWEEN ? AND ?", (4, 12)))
    assert _verify(path) == (False, 4)


def test_swapping_two_rows_fails_at_the_first_of_them(
    pristine: tuple[Path, int], tmp_path: Path
) -> None:
    path, _ = _copy(pristine, tmp_path)
    cols = "at, invocation_id, session_id, kind, source, observer, observer_seq, attrs, payload"
    _tamper(
        path,
        (
            f"CREATE TEMP TABLE a AS SELECT {cols}, audit, prev_hash, hash FROM events "
            "WHERE seq = 9",
            (),
        ),
        (
            f"CREATE TEMP TABLE b AS SELECT {cols}, audit, prev_hash, hash FROM events "
            "WHERE seq = 10",
            (),
        ),
        ("DELETE FROM events WHERE seq IN (9, 10)", ()),
        (f"INSERT INTO events SELECT 9, {cols}, audit, prev_hash, hash FROM b", ()),
        (f"INSERT INTO events SELECT 10, {cols}, audit, prev_hash, hash FROM a", ()),
    )
    assert _verify(path) == (False, 9)


def test_reordering_by_renumbering_fails(pristine: tuple[Path, int], tmp_path: Path) -> None:
    # Swapping whole rows including their seq: move row 3 to the end, shift the rest down.
    path, count = _copy(pristine, tmp_path)
    _tamper(
        path,
        ("UPDATE events SET seq = ? WHERE seq = 3", (count + 1,)),
        ("UPDATE events SET seq = seq - 1 WHERE seq > 3", ()),
    )
    assert _verify(path) == (False, 3)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_any_single_edit_or_delete_is_found_at_its_row(
    pristine: tuple[Path, int], tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    path, count = _copy(pristine, tmp_path_factory.mktemp("h"))
    seq = data.draw(st.integers(1, count - 1), label="seq")
    how = data.draw(st.sampled_from([*sorted(EDITS), "delete"]), label="how")
    stmt = ("DELETE FROM events WHERE seq = ?", (seq,)) if how == "delete" else EDITS[how](seq)
    _tamper(path, stmt)
    assert _verify(path) == (False, seq)


def test_schema_refuses_forks_gaps_and_rewrites(pristine: tuple[Path, int], tmp_path: Path) -> None:
    path, count = _copy(pristine, tmp_path)
    conn = sqlite3.connect(path, isolation_level=None)
    row = list(conn.execute("SELECT * FROM events WHERE seq = ?", (count,)).fetchone())
    fork = [count + 1, *row[1:11], row[11], "0" * 64]  # reuses the head's prev_hash: a fork
    gap = [count + 2, *row[1:11], row[12], "1" * 64]
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(f"INSERT INTO events VALUES ({','.join('?' * 13)})", fork)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(f"INSERT INTO events VALUES ({','.join('?' * 13)})", gap)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE events SET attrs = '{}' WHERE seq = 1")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("DELETE FROM events WHERE seq = 1")
    conn.close()
    assert _verify(path) == (True, None)


def test_verify_json_reports_the_bad_seq(
    pristine: tuple[Path, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path, _ = _copy(pristine, tmp_path)
    _tamper(path, EDITS["attrs"](2))
    assert cli_main(["journal", "verify", "--journal", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["first_bad_seq"] == 2 and out["count"] == 1


def test_two_interleaved_invocations_chain_in_seq_order(tmp_path: Path) -> None:
    async def fill() -> None:
        async with Journal.open(tmp_path / "j.db") as j:
            for a, b in zip(interrupted("a"), interrupted("b"), strict=True):
                await j.append(a)
                await j.append(b)

    trio.run(fill)
    with JournalReader.open(tmp_path / "j.db") as r:
        assert [e.seq for e in r.events("a")] == [1, 3, 5, 7, 9]
        assert r.verify().count == 10


# The chain's bytes must never change: journals written earlier must still verify.  These pin
# the fast encoders to the reference ``json.dumps`` calls the chain was defined with.
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(value=st.dictionaries(st.text(), _JSON, max_size=5))
def test_canonical_json_is_the_reference_encoding(value: dict[str, object]) -> None:
    import json

    from affidavit.journal.chain import canonical_json

    ref = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert canonical_json(value) == ref


def test_canonical_json_refuses_nan_and_non_json() -> None:
    from affidavit.journal.chain import canonical_json

    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    with pytest.raises(TypeError):
        canonical_json({"x": object()})


@given(
    seq=st.integers(min_value=1, max_value=2**62),
    at=st.floats(allow_nan=False, allow_infinity=False),
    iid=st.text(),
    session=st.none() | st.text(),
    attrs=st.text(),
    payload=st.none() | st.binary(max_size=64),
)
def test_row_hash_is_the_reference_hash(
    seq: int, at: float, iid: str, session: str | None, attrs: str, payload: bytes | None
) -> None:
    import hashlib
    import json

    prev = hashlib.sha256(iid.encode("utf-8", "surrogatepass")).hexdigest()
    row = [seq, at, iid, session, "REQUEST_SENT", "transport_observed", None, None, attrs]
    digests = [None if payload is None else hashlib.sha256(payload).hexdigest(), None]
    canonical = json.dumps([*row, *digests], separators=(",", ":"), ensure_ascii=False)
    ref = hashlib.sha256(bytes.fromhex(prev) + canonical.encode("utf-8")).hexdigest()
    args = (seq, at, iid, session, "REQUEST_SENT", "transport_observed", None, None, attrs)
    assert row_hash(prev, *args, payload, None) == ref


def _reference_digest(prev: bytes, *row: object) -> bytes:
    """The row hash as first specified: ``json.dumps`` of the columns (blobs by SHA-256)."""
    import hashlib
    import json

    *cols, payload, audit = row
    digests = [None if b is None else hashlib.sha256(b).hexdigest() for b in (payload, audit)]  # type: ignore[arg-type]
    canonical = json.dumps([*cols, *digests], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(prev + canonical.encode("utf-8")).digest()


@given(
    seq=st.integers(min_value=0, max_value=2**70),
    at=st.floats(allow_nan=False, allow_infinity=False),
    iid=st.text(),
    session=st.none() | st.text(),
    kind=st.sampled_from(["ACTION_ACCEPTED", "PROTOCOL_OBSERVED"]) | st.text(),
    observer=st.none() | st.text(),
    observer_seq=st.none() | st.integers(min_value=-(2**70), max_value=2**70),
    attrs=st.text(),
    payload=st.none() | st.binary(max_size=64),
    audit=st.none() | st.binary(max_size=64),
)
def test_row_digest_of_every_column_is_the_reference_digest(
    seq: int,
    at: float,
    iid: str,
    session: str | None,
    kind: str,
    observer: str | None,
    observer_seq: int | None,
    attrs: str,
    payload: bytes | None,
    audit: bytes | None,
) -> None:
    # The writer's columns take row_digest's direct path (no list encoded): every one of them,
    # control characters, quotes, non-ASCII and lone surrogates included, hashes as specified.
    from affidavit.journal.chain import row_digest

    prev = bytes(range(32))
    row = (seq, at, iid, session, kind, "transport_observed", observer, observer_seq, attrs,
           payload, audit)  # fmt: skip
    try:
        want: bytes | type[BaseException] = _reference_digest(prev, *row)
    except UnicodeEncodeError:  # a lone surrogate: refused alike
        want = UnicodeEncodeError
    if want is UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            row_digest(prev, *row)  # type: ignore[arg-type]
    else:
        assert row_digest(prev, *row) == want  # type: ignore[arg-type]


class _Str(str):
    pass


class _Int(int):
    def __repr__(self) -> str:
        return "not-the-encoder's"


@pytest.mark.parametrize(
    "column, value",
    [
        (0, True),  # seq read back as a bool: JSON true, not 1
        (0, _Int(7)),  # an int subclass: the encoder writes int.__repr__
        (1, 3),  # at as an int: 3, not 3.0
        (1, float("nan")),
        (1, float("inf")),
        (1, -float("inf")),
        (2, _Str("inv")),
        (3, _Str("s")),
        (6, "obs"),
        (7, False),
        (8, _Str('{"a":1}')),
    ],
)
def test_row_digest_of_altered_column_types_is_the_reference_digest(
    column: int, value: object
) -> None:
    # Columns of other types than the writer stores (a row someone altered, read by verify)
    # hash exactly as the encoder writes them, so an alteration is still told apart.
    from affidavit.journal.chain import row_digest

    prev = b"\x01" * 32
    row: list[object] = [5, 1.25, "inv", None, "REQUEST_SENT", "transport_observed", None, None,
                         '{"generation":0}', b"p", None]  # fmt: skip
    row[column] = value
    assert row_digest(prev, *row) == _reference_digest(prev, *row)  # type: ignore[arg-type]


def test_row_hash_of_a_known_row_is_pinned() -> None:
    # Computed once with the original implementation; a change here breaks every stored chain.
    h = row_hash(GENESIS, 1, 1.5, "inv-1", "s", "ACTION_ACCEPTED", "transport_observed",
                 None, None, '{"a":1}', b"p", None)  # fmt: skip
    assert h == "17c5212c8b7780ce69139a12d5034018463c38e575336b97b44b2564b1a596e5"


def test_journal_created_with_a_unique_prev_hash_still_opens_appends_and_verifies(
    tmp_path: Path,
) -> None:
    from affidavit.journal.sqlite import SCHEMA

    path = tmp_path / "old.db"
    old = SCHEMA.replace("prev_hash     TEXT NOT NULL,", "prev_hash     TEXT NOT NULL UNIQUE,")
    assert old != SCHEMA
    conn = sqlite3.connect(path)
    conn.executescript(old)
    conn.close()

    async def fill() -> None:
        async with Journal.open(path) as j:
            for ev in happy("inv-old"):
                await j.append(ev)

    trio.run(fill)
    with JournalReader.open(path) as r:
        assert r.verify().count == len(happy("x"))


def test_a_directory_or_garbage_at_the_journal_path_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # sqlite3.connect() itself raises on a directory; that must be the same clear error as a
    # file that is not a journal (exit 2, message on stderr), never a traceback.
    (tmp_path / "d.db").mkdir()
    (tmp_path / "junk.db").write_bytes(b"\x00not sqlite\xff" * 100)
    for name in ("d.db", "junk.db"):
        with pytest.raises(JournalError, match="not a readable journal"):
            JournalReader.open(tmp_path / name)
        for cmd in (["journal", "verify"], ["actions"], ["sessions"], ["metrics"]):
            assert cli_main([*cmd, "--journal", str(tmp_path / name)]) == 2
            assert "not a readable journal" in capsys.readouterr().err


_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities too: json.dumps writes them, json.loads reads them
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=4) | st.integers() | st.booleans(), inner, max_size=4)
    ),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSONISH)
def test_json_copy_is_what_json_reads_back(value: object) -> None:
    """``json_copy`` stands in for ``json.loads(json.dumps(value))`` on the engine's result
    path: the same value, key order included (tuples as lists, keys as strings), as a copy."""
    import json

    from affidavit.journal import json_copy

    got, want = json_copy(value), json.loads(json.dumps(value))
    assert json.dumps(got) == json.dumps(want)  # NaN != NaN: compare the texts, in order
    if isinstance(value, dict | list):
        assert got is not value


def test_json_copy_refuses_what_json_cannot_hold() -> None:
    from affidavit.journal import json_copy

    with pytest.raises(TypeError):
        json_copy({"a": {1, 2}})


def test_sqlite_null_of_an_event_row_binds_as_sql_null() -> None:
    # The writer hands SQLite a NaN for each NULL column of an event row (SqliteTables.NULL:
    # no adapter lookup per None); SQLite stores it as NULL -- never as a REAL, never NaN.
    from affidavit.journal.sqlite import SqliteTables

    null = SqliteTables.NULL
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (s TEXT, i INTEGER, b BLOB, x)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(null, null, null, null)] * 2)
    conn.execute("INSERT INTO t VALUES (?, ?, ?, ?)", (null, null, null, null))
    rows = conn.execute("SELECT typeof(s), typeof(i), typeof(b), typeof(x), s IS NULL FROM t")
    assert rows.fetchall() == [("null", "null", "null", "null", 1)] * 3
    conn.close()


def test_null_columns_of_appended_rows_are_stored_as_null(tmp_path: Path) -> None:
    # Rows without a session, observer, observer_seq, payload or auditor copy: each of those
    # columns holds SQL NULL (as a None bound would), next to rows holding values, and the
    # journal verifies.
    path = tmp_path / "j.db"

    async def fill() -> None:
        async with Journal.open(path) as j:
            for ev in happy("inv-null", session=None):
                await j.append(ev)
            for ev in happy("inv-full"):
                await j.append(ev, payload={"note": "x"})

    trio.run(fill)
    conn = sqlite3.connect(path)
    rows = conn.execute(
        "SELECT invocation_id, typeof(session_id), typeof(observer), typeof(observer_seq), "
        "typeof(payload), typeof(audit) FROM events ORDER BY seq"
    ).fetchall()
    conn.close()
    nulls = {r[1:] for r in rows if r[0] == "inv-null"}
    full = {r[1:] for r in rows if r[0] == "inv-full"}
    assert nulls == {("null", "null", "null", "null", "null")}
    assert full == {("text", "null", "null", "blob", "null")}
    assert _verify(path) == (True, None)


@pytest.mark.parametrize(
    "iid, session, at, observer, observer_seq",
    [
        ("inv-plain", "sess-1", None, None, None),
        ('inv "q" \\ \x01\u2028 é ☃ 𝄞', 'sess "é" \x7f', 1733362537.123456, None, None),
        ("inv-obs", None, 1e22, 'obs "ü"\t', 2**62),
        ("inv-at", "s", 3, "o", 5),  # an int at: stored as the float the writer makes of it
        # The largest it stores (a larger observer_seq, a NaN or infinite at: refused,
        # tests/journal/conformance/test_store.py).
        ("inv-max", "s", 1.7e308, "o", 2**63 - 1 - 10),
    ],
)
def test_the_writers_row_hash_is_the_one_verify_recomputes(
    tmp_path: Path,
    iid: str,
    session: str | None,
    at: float | None,
    observer: str | None,
    observer_seq: int | None,
) -> None:
    # Txn.insert hashes a row inline (row_digest's direct path, without the call): every
    # column it stores -- quotes, control characters, non-ASCII, observers, given times --
    # hashes exactly as row_hash recomputes it from the stored columns.
    import dataclasses

    path = tmp_path / "j.db"

    async def fill() -> None:
        async with Journal.open(path) as j:
            for n, ev in enumerate(happy(iid, session)):
                ev = dataclasses.replace(
                    ev,
                    attrs={**ev.attrs, "note": f'"{iid}" {n}'} if n == 0 else ev.attrs,
                    at=at,
                    observer=observer,
                    observer_seq=None if observer_seq is None else observer_seq + n,
                )
                await j.append(ev)

    trio.run(fill)
    conn = sqlite3.connect(path)
    rows = conn.execute(
        "SELECT seq, at, invocation_id, session_id, kind, source, observer, observer_seq, "
        "attrs, payload, audit, prev_hash, hash FROM events ORDER BY seq"
    ).fetchall()
    conn.close()
    assert len(rows) == len(happy(iid, session))
    prev = GENESIS
    for row in rows:
        assert row[11] == prev
        assert row[12] == row_hash(prev, *row[:11])
        prev = row[12]
    assert cli_main(["journal", "verify", "--journal", str(path)]) == 0
