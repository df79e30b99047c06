"""A read-only reader kept for another read (the broker's idle view readers): its connection
replaced after the server ended it is one like it was opened with -- no statement timeout,
which only the writing journal's own reader has -- and ``reset`` leaves no snapshot behind, so
the next read sees rows appended since."""

from __future__ import annotations

from pathlib import Path

from affidavit.journal import Journal, JournalReader
from tests.postgres import Cluster

from .helpers import happy


def _keys(tmp: Path) -> dict[str, Path]:
    return {"key_file": tmp / "shared.key", "signing_key": tmp / "b.signing.key"}


async def test_a_lost_read_only_connection_is_replaced_by_one_without_a_statement_timeout(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    async with Journal.open(pg_url, **_keys(tmp_path), reconnect_within=2.0) as j:
        for ev in happy("act_1"):
            await j.append(ev)
    with JournalReader.open(pg_url, key_file=tmp_path / "shared.key") as reader:
        assert reader._rconn.execute("SHOW statement_timeout").fetchone()[0] == "0"
        assert pg.terminate(reader._rconn.info.backend_pid, pg_url.rsplit("/", 1)[1])
        assert len(reader.events("act_1")) == len(happy("act_1"))  # read on a new connection
        assert reader._rconn.execute("SHOW statement_timeout").fetchone()[0] == "0"


async def test_reset_ends_a_snapshot_a_read_left_open(pg_url: str, tmp_path: Path) -> None:
    async with Journal.open(pg_url, **_keys(tmp_path)) as j:
        for ev in happy("act_1"):
            await j.append(ev)
        with JournalReader.open(pg_url, key_file=tmp_path / "shared.key") as reader:
            left = reader.backend.snapshot(reader._rconn)  # a read that left it open
            left.__enter__()
            seen = reader.head()
            for ev in happy("act_2"):
                await j.append(ev)
            assert reader.head() == seen  # (the snapshot holds)
            reader.reset()
            assert reader.head()[0] == seen[0] + len(happy("act_2"))
            assert reader.events("act_2")
