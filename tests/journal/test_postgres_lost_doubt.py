"""A batch's run lost and run again (``journal/commit.py``, ``attempts``): a COMMIT lost with no
row to read back (a result's chunk) leaves a doubt that its later runs -- refused, or
committed with one of its writes refused -- answer as unknown, never "not stored"; one loss
ridden out is said by nothing and costs no spacing, however late in ``[journal] reconnect``
the new connection came."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from affidavit.journal import (
    Journal,
    ResultStoreFailed,
    ResultStoreUnknown,
    commit,
    results,
)
from affidavit.journal.requests import Batch
from tests.postgres import Cluster, Proxy

from .helpers import lose_runs_then_commit, pg_keys, until_dispatch

LIMIT = 30


async def _chunk_after_a_lost_commit(
    pg: Cluster, pg_url: str, tmp_path: Path, second_run: Any, within: float = 5.0
) -> BaseException:
    """A chunk whose first run's COMMIT lands and whose answer is lost; ``second_run(proxy)``,
    the ``before_commit`` hook of the run after it.  What the write raised."""
    database = pg_url.rsplit("/", 1)[1]
    proxy = Proxy(pg.port)
    calls: list[Batch] = []
    try:
        async with Journal.open(
            proxy.url(pg, pg_url), reconnect_within=within, **pg_keys(tmp_path)
        ) as j:
            for ev in until_dispatch("inv-1"):
                await j.append(ev)

            def hook(b: Batch) -> None:
                calls.append(b)
                if len(calls) == 1:
                    proxy.lose_next_answer()  # the COMMIT lands, its answer is lost
                else:
                    second_run(proxy)

            j.before_commit = hook
            with trio.fail_after(LIMIT), pytest.raises(ResultStoreFailed) as info:
                await j.put_result_chunk("inv-1", "body", 0, b"chunk")
            j.before_commit = None
    finally:
        proxy.close()
    assert proxy.lost_answers == 1 and len(calls) >= 1, (proxy.lost_answers, calls)
    assert pg.sql("SELECT count(*) FROM result_chunks", database) == [(1,)]  # it landed
    return info.value


async def test_a_rerun_refused_after_a_lost_chunk_commit_is_unknown(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Run 1's COMMIT landed, its answer lost; run 2 is refused by the database (a unique
    violation, not a lost session).  The chunk is durable: the write fails unknown, naming
    the earlier run -- never "not committed" decided by the refused run alone."""

    def refuse(_: Proxy) -> None:
        raise psycopg.errors.UniqueViolation("duplicate key value violates unique constraint")

    raised = await _chunk_after_a_lost_commit(pg, pg_url, tmp_path, refuse)
    said = str(raised)
    assert isinstance(raised, ResultStoreUnknown), said
    assert "while committing an earlier run of this write" in said, said
    assert "its run again failed (write not committed: duplicate key value" in said, said
    assert "durable is unknown" in said and pg.password not in said, said


async def test_a_chunk_refused_by_a_committing_rerun_after_its_lost_commit_is_unknown(
    pg: Cluster, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 1's COMMIT landed, its answer lost; before run 2, recovery closed the attempt, so
    run 2 commits with the chunk refused ("attempt is closed").  Run 1's chunk is durable:
    the write is answered unknown, not "not stored" (``ResultStoreFailed`` alone)."""
    real = results.chunk_op

    def closing_chunk_op(*args: Any, **kwargs: Any) -> Any:
        op = real(*args, **kwargs)
        runs: list[int] = []

        def rerun_refused(txn: Any) -> Any:
            runs.append(1)
            if len(runs) > 1:  # the attempt closed between the runs
                raise ResultStoreFailed("result chunk of invocation inv-1: attempt is closed")
            return op(txn)

        return rerun_refused

    monkeypatch.setattr(results, "chunk_op", closing_chunk_op)
    raised = await _chunk_after_a_lost_commit(pg, pg_url, tmp_path, lambda _: None)
    said = str(raised)
    assert isinstance(raised, ResultStoreUnknown), said
    assert "attempt is closed" in said and "earlier run of this write" in said, said
    assert "durable is unknown" in said, said


async def test_a_single_lost_run_ridden_out_warns_nothing(
    pg: Cluster, pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A restart ridden out: one run lost, the next committed.  No warning (an embedded
    ``affidavit call`` printed it on its stderr, by logging's last-resort handler)."""
    caplog.set_level(logging.WARNING, logger="affidavit.journal")
    await lose_runs_then_commit(pg, pg_url, tmp_path, within=10.0, losses=1)
    said = [r.getMessage() for r in caplog.records if r.name == "affidavit.journal"]
    assert not any("the connection was lost" in m for m in said), said


async def test_a_reconnect_late_in_the_window_still_runs_the_batch_again(
    pg: Cluster, pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new connection after the one loss is made 0.02 s before ``reconnect`` runs out
    (held there by patching the reconnect): the batch runs again and commits -- it failed
    "lost on each of 1 runs" when the spacing's 0.05 s did not fit in what was left."""
    real = commit._reconnect_and_check

    def late(w: Any, deadline: float, *args: Any, **kwargs: Any) -> Any:
        durable = real(w, deadline, *args, **kwargs)
        time.sleep(max(deadline - 0.02 - time.monotonic(), 0))
        return durable

    monkeypatch.setattr(commit, "_reconnect_and_check", late)
    await lose_runs_then_commit(pg, pg_url, tmp_path, within=1.0, losses=1)


async def test_a_rerun_lost_before_its_commit_after_an_earlier_lost_commit_says_so(
    pg: Cluster, pg_url: str, tmp_path: Path
) -> None:
    """Run 1's COMMIT landed, its answer lost; run 2's connection is cut before its COMMIT and
    no new one can be made.  Unknown, and the doubt is the earlier run's: the message says
    so, not that this run was lost while committing."""

    def cut(proxy: Proxy) -> None:
        proxy.cut()
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    raised = await _chunk_after_a_lost_commit(pg, pg_url, tmp_path, cut, within=0.5)
    said = str(raised)
    assert isinstance(raised, ResultStoreUnknown), said
    assert "lost while committing an earlier run of this write and no new one" in said, said
