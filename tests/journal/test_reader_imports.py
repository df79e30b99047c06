"""A reader of the journal imports none of the writer's side: ``trio`` (~0.15 s of a process's
start) is imported by ``Journal``, never by ``JournalReader`` and the views -- what ``affidavit
actions``, ``journal verify`` and both processes of ``actions --json`` load.  The writer's
names still come from the package, imported when first asked for."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import trio

from affidavit.journal import Journal, JournalReader
from affidavit.journal import __all__ as exported

from .helpers import happy


def _modules_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(done.stdout))


def test_a_reader_and_the_views_import_no_trio(tmp_path: Path) -> None:
    db = tmp_path / "j.db"

    async def write() -> None:
        async with Journal.open(db) as j:
            for ev in happy("a"):
                await j.append(ev)

    trio.run(write)
    with JournalReader.open(db) as r:
        assert [rec.invocation_id for rec in r.iter_actions()] == ["a"]
    loaded = _modules_after(
        "from affidavit.journal import JournalReader\n"
        "from affidavit.views import record_json_encoder\n"
        f"with JournalReader.open({str(db)!r}) as r:\n"
        "    assert [record_json_encoder(operator=True)(x) for x in r.iter_actions()]\n"
    )
    assert "affidavit.journal.reader" in loaded  # (the probe ran)
    assert not {"trio", "affidavit.journal.store", "affidavit.journal.writer"} & loaded


def test_the_writers_names_are_still_the_packages() -> None:
    loaded = _modules_after(
        "import affidavit.journal as j\n"
        "from affidavit.journal import Journal, Batch, Posted, ResultWriter, StreamInfo\n"
        "assert j.Journal is Journal and j.StoredResult.__name__ == 'StoredResult'\n"
        "for name in j.__all__:\n"
        "    getattr(j, name)\n"
    )
    assert {"trio", "affidavit.journal.store"} <= loaded
    assert "Journal" in exported and "JournalReader" in exported
    import affidavit.journal as package

    try:
        package.NoSuchName  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchName" in str(exc)
    else:
        raise AssertionError("an unknown name was found")
