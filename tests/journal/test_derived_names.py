"""A journal's derived files follow the file, not the name it is opened under (``names.py``).

The long results' ``<journal>.results/``, the default ``<journal>.key`` and
``<journal>.signing.key`` were made beside the name given: a journal opened through a link in
another directory read its long results as altered ("chunk 0 differs from its chained hash")
and ``verify`` blamed a missing results directory.  Files an earlier version left beside a link
only are refused with the ``mv`` that fixes it -- never a fresh key, never a claim of tampering.
The broker's, the CLI's and the console's ways in: tests/broker/test_journal_link_names.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalError, JournalReader

from . import segkit as kit


@pytest.fixture
def names(tmp_path: Path) -> tuple[Path, Path]:
    """``(real, link)``: ``d/j.db`` and ``other/link.db`` naming it, from another directory."""
    (tmp_path / "d").mkdir()
    (tmp_path / "other").mkdir()
    real, link = tmp_path / "d" / "j.db", tmp_path / "other" / "link.db"
    link.symlink_to(real)
    return real, link


def _store(db: Path, iid: str, data: bytes) -> None:
    async def run() -> None:
        async with Journal.open(db) as j:
            await kit.store(j, iid, data)

    trio.run(run)


def _read_back(db: Path, expect: dict[str, bytes]) -> None:
    with JournalReader.open(db) as r:
        for iid, data in expect.items():
            res = r.read_result(iid)
            assert res is not None and res.streams == {"body": data}
        report = r.verify()
        assert report.ok and report.results == len(expect), report


def test_a_long_result_written_through_a_link_reads_back_through_the_real_name_and_back(
    names: tuple[Path, Path],
) -> None:
    real, link = names
    first, second = kit.body(30, 5), kit.body(31, 7)
    _store(link, "inv-1", first)
    assert kit.segments(real) and not os.path.lexists(f"{link}.results")
    _read_back(real, {"inv-1": first})
    _store(real, "inv-2", second)
    _read_back(link, {"inv-1": first, "inv-2": second})
    beside_link = sorted(p.name for p in link.parent.iterdir())
    assert beside_link == ["link.db"]  # no key, lock or results directory of its own


LEFT = [
    (".key", "sealing key"),
    (".signing.key", "signing key"),
    (".results", "result segment directory"),
]


def _left_beside_the_link(real: Path, link: Path, suffix: str) -> Path:
    """A journal with a long result, whose ``suffix`` file an earlier version kept beside
    ``link`` (moved there from beside ``real``)."""
    _store(real, "inv-1", kit.body(30, 5))
    old = Path(f"{link}{suffix}")
    os.rename(f"{real}{suffix}", old)
    return old


@pytest.mark.parametrize(("suffix", "what"), LEFT)
def test_a_file_left_beside_the_link_only_is_refused_with_the_mv_that_fixes_it(
    names: tuple[Path, Path], tmp_path: Path, suffix: str, what: str
) -> None:
    real, link = names
    old = _left_beside_the_link(real, link, suffix)
    before = {p: sorted(os.listdir(p)) for p in (real.parent, link.parent)}

    async def refused() -> None:
        with pytest.raises(JournalError, match=f"whose {what} is kept beside it") as info:
            async with Journal.open(link):
                pass
        message = str(info.value)
        assert f"mv {old} {real}{suffix}" in message
        assert info.value.public is not None and str(tmp_path) not in info.value.public

    trio.run(refused)
    if suffix != ".signing.key":  # (a reader needs no signing key of its own)
        with pytest.raises(JournalError, match="mv "):
            JournalReader.open(link)
    # Nothing made beside the file: no fresh key, no empty results directory, no lock.
    assert {p: sorted(os.listdir(p)) for p in (real.parent, link.parent)} == before
    os.rename(old, f"{real}{suffix}")  # the advice taken: opened as before
    _read_back(link, {"inv-1": kit.body(30, 5)})


def test_a_key_configured_elsewhere_is_not_refused_for_one_left_beside_the_link(
    names: tuple[Path, Path], tmp_path: Path
) -> None:
    real, link = names
    key = tmp_path / "keys" / "sealing.key"
    key.parent.mkdir()
    _store(real, "inv-1", kit.body(30, 5))
    os.rename(f"{real}.key", key)
    Path(f"{link}.key").write_bytes(b"an old file no one uses")
    with JournalReader.open(link, key_file=key) as r:
        assert r.verify().ok
