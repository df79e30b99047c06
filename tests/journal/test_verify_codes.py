"""Every break ``verify`` finds answers a stable code (``journal/verify_codes.py``), in
``journal verify --json``'s ``code`` and on its text line -- not ``null`` for all but the anchor
and signing-record ones, which left a monitor parsing sentences.  A segment file that is gone
reads as a missing chunk (``CHUNK_MISSING``; a result "incomplete: chunk N is missing"), never
as an edit ("differs from its chained hash")."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from affidavit.journal import Journal, JournalError, JournalReader, verify_codes

from . import segkit as kit
from .helpers import flip_stored_byte

_CANARY = b"CANARY-verify-codes-7d3a"
_DOCS = Path(__file__).resolve().parents[2] / "docs" / "journal.md"


async def _build(db: Path) -> None:
    async with Journal.open(db) as j:
        await kit.store(j, "inv-long", kit.body(12, 5))  # in a segment file
        await kit.store(j, "inv-short", _CANARY * 10)  # inline chunk rows


def _seq(db: Path, sql: str) -> int:
    import sqlite3

    with sqlite3.connect(db) as conn:
        got = conn.execute(sql).fetchone()[0]
    conn.close()
    assert isinstance(got, int)
    return got


def _segment_gone(db: Path) -> None:
    [segment] = kit.segments(db)
    segment.unlink()


def _first_checkpoint_gone(db: Path) -> None:
    kit.tamper(
        db,
        "DROP TRIGGER checkpoints_no_delete",
        "DELETE FROM checkpoints WHERE seq = (SELECT min(seq) FROM checkpoints)",
    )


_BREAKS: dict[str, tuple[Callable[[Path], None], str]] = {
    "row-edited": (
        lambda db: kit.tamper(
            db, "DROP TRIGGER events_no_update", "UPDATE events SET attrs = '{}' WHERE seq = 2"
        ),
        verify_codes.ROW_ALTERED,
    ),
    "row-deleted": (
        lambda db: kit.tamper(
            db, "DROP TRIGGER events_no_delete", "DELETE FROM events WHERE seq = 3"
        ),
        verify_codes.ROW_MISSING,
    ),
    "row-relinked": (
        lambda db: kit.tamper(
            db,
            "DROP TRIGGER events_no_update",
            f"UPDATE events SET prev_hash = '{'0' * 64}' WHERE seq = 4",
        ),
        verify_codes.CHAIN_BROKEN,
    ),
    "checkpoint-forged": (
        lambda db: kit.tamper(
            db,
            "DROP TRIGGER checkpoints_no_update",
            "UPDATE checkpoints SET signature = zeroblob(64) "
            "WHERE seq = (SELECT min(seq) FROM checkpoints)",
        ),
        verify_codes.CHECKPOINT_INVALID,
    ),
    "checkpoint-removed": (_first_checkpoint_gone, verify_codes.CHECKPOINT_MISSING),
    "marker-removed": (
        lambda db: kit.tamper(db, "DELETE FROM results WHERE invocation_id = 'inv-short'"),
        verify_codes.MARKER_MISSING,
    ),
    "chunk-row-removed": (
        lambda db: kit.tamper(db, "DELETE FROM result_chunks WHERE invocation_id = 'inv-short'"),
        verify_codes.CHUNK_MISSING,
    ),
    "chunk-flipped": (
        lambda db: flip_stored_byte(db, "inv-long", "body", 1),
        verify_codes.CHUNK_DIFFERS,
    ),
    "segment-file-removed": (_segment_gone, verify_codes.CHUNK_MISSING),
}


@pytest.mark.parametrize("name", sorted(_BREAKS))
def test_each_break_answers_its_code(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "j.db"
    trio.run(_build, db)
    damage, code = _BREAKS[name]
    damage(db)
    argv = ["journal", "verify", "--journal", str(db)]
    assert cli_main([*argv, "--json"]) == 1
    out = capsys.readouterr().out
    report = json.loads(out)
    assert not report["ok"] and report["code"] == code, report
    assert cli_main(argv) == 1
    text = capsys.readouterr().out
    assert re.search(rf"journal BROKEN at seq \d+ \({code}\): ", text), text
    for said in (out, text):
        assert _CANARY.decode() not in said


def test_a_removed_segment_file_reads_as_missing_not_altered(tmp_path: Path) -> None:
    """The file gone, its directory there: verify and a read say "missing"; an edit of the
    same file still says "differs"."""
    db = tmp_path / "j.db"
    trio.run(_build, db)
    _segment_gone(db)
    with JournalReader.open(db) as r:
        report = r.verify()
        assert report.code == verify_codes.CHUNK_MISSING
        assert "stream 'body' chunk 0 is missing" in report.reason, report.reason
        assert "differs" not in report.reason
        with pytest.raises(JournalError, match="incomplete: chunk 0 is missing"):
            r.read_result("inv-long")
        short = r.read_result("inv-short")
        assert short is not None and short.streams["body"] == _CANARY * 10


def test_every_code_is_listed_in_the_docs() -> None:
    text = _DOCS.read_text(encoding="utf-8")
    for code in verify_codes.__all__:
        assert f"`{code}`" in text, code


def test_every_further_problem_answers_its_code_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``also``'s problems carry codes as the first does: ``also_codes`` in ``--json``, one per
    entry, and ``also (CODE): ...`` on the text lines -- not sentences alone."""
    db = tmp_path / "j.db"
    trio.run(_build, db)
    flip_stored_byte(db, "inv-long", "body", 1)
    kit.tamper(db, "DELETE FROM result_chunks WHERE invocation_id = 'inv-short'")
    argv = ["journal", "verify", "--journal", str(db)]
    assert cli_main([*argv, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["also"] and len(report["also_codes"]) == len(report["also"]), report
    assert None not in report["also_codes"], report
    found = {report["code"], *report["also_codes"]}
    assert {verify_codes.CHUNK_DIFFERS, verify_codes.CHUNK_MISSING} <= found, report
    assert found <= set(verify_codes.__all__), report
    assert cli_main(argv) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  also")]
    assert lines == [
        f"  also ({code}): {said}"
        for said, code in zip(report["also"], report["also_codes"], strict=True)
    ]


def test_further_problems_without_their_codes_are_said_without_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Should ``also_codes`` ever be shorter than ``also``, the entries without one are said
    with no code (``null`` in ``--json``, one per entry still) -- never a traceback."""
    db = tmp_path / "j.db"
    trio.run(_build, db)
    flip_stored_byte(db, "inv-long", "body", 1)
    kit.tamper(db, "DELETE FROM result_chunks WHERE invocation_id = 'inv-short'")
    verify = JournalReader.verify

    def codeless(self: JournalReader, **kwargs: object) -> object:
        got = verify(self, **kwargs)  # type: ignore[arg-type]
        return dataclasses.replace(got, also_codes=())

    monkeypatch.setattr(JournalReader, "verify", codeless)
    argv = ["journal", "verify", "--journal", str(db)]
    assert cli_main([*argv, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["also"] and report["also_codes"] == [None] * len(report["also"]), report
    assert cli_main(argv) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    lines = [x for x in out.splitlines() if x.startswith("  also")]
    assert lines == [f"  also: {said}" for said in report["also"]], out
