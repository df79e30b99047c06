"""A stored result that fails verification, read with ``affidavit result`` embedded and through
the daemon: the same code (RESULT_UNVERIFIED), the same exit status (2), no field, and never its
bytes -- embedded used to say JOURNAL_UNUSABLE (the journal's file or key cannot be used), which
sends an operator to fix permissions on a journal that is fine but for one altered chunk."""

from __future__ import annotations

from pathlib import Path

from affidavit.cli import error_json
from tests.http.hostile import Reply, scripts
from tests.journal.helpers import flip_stored_byte

from .kit import Run, action_bytes, cli, embedded, serving, stop


def _refusal(run: Run) -> tuple[int, str | None, str | None]:
    """(exit status, code, field) of a one-line refusal on stderr, as ``--json`` would give."""
    line = run.stderr.decode()
    assert run.stdout == b"" and line.count("\n") == 1 and "Traceback" not in line, line
    code, _, rest = line.removeprefix("affidavit: ").partition(": ")
    error = error_json(rest.strip(), code, None)["api_error"]
    return run.returncode, error["code"], error.get("field")


async def test_a_corrupted_chunk_is_result_unverified_embedded_and_through_the_daemon(
    tmp_path: Path, token: str
) -> None:
    body = b"secret-free stored body " * 40
    async with serving(tmp_path, scripts.serve(Reply(200, body=body)), token=token) as (
        _srv,
        daemon,
    ):
        called = await cli(daemon, "call", "-", stdin=action_bytes("/r"))
        assert called.returncode == 0, called.stderr
        iid = called.json()["invocation_id"]
        flip_stored_byte(daemon.journal, iid, "body", 0)
        through = [
            await cli(daemon, "result", iid, *extra) for extra in ([], ["--from-chunk", "0"])
        ]
    stop(daemon)  # the journal is the daemon's while it runs: embedded reads it after
    config = str(daemon.config)
    alone = [
        await embedded("result", iid, "--config", config, *extra, token=token)
        for extra in ([], ["--from-chunk", "0"])
    ]
    raw = await embedded("result", iid, "--raw", "--config", config, token=token)
    for run in [*through, *alone]:
        assert _refusal(run) == (2, "RESULT_UNVERIFIED", None), run
        assert b"chunk 0" in run.stderr and b"stored body" not in run.stderr
    assert raw.returncode == 2 and raw.stdout == b""
    assert raw.stderr.startswith(b"affidavit: RESULT_UNVERIFIED: "), raw.stderr


async def test_result_raw_of_a_result_by_reference_records_its_delivery_once_written(
    tmp_path: Path, token: str
) -> None:
    """``affidavit result ID --raw`` writes the only stream whole: once its last byte is out,
    it is a whole fetch -- RESULT_DELIVERED channel ``fetch`` (review 53c: the bytes were all
    read and the record stayed ``stored_committed`` for ever).  With ``--from-chunk`` (even 0)
    it is a page and records nothing."""
    import json

    body = b"z" * (1024 * 1024 + 3)  # over the inline limit: answered by reference
    async with serving(tmp_path, scripts.serve(Reply(200, body=body)), token=token) as (
        _srv,
        daemon,
    ):
        called = await cli(daemon, "call", "-", stdin=action_bytes("/r"))
        assert called.returncode == 0, called.stderr
        iid = called.json()["invocation_id"]
        assert "by_reference" in called.json()["result"]
    stop(daemon)
    config = str(daemon.config)
    before = await embedded("record", iid, "--json", "--config", config, token=token)
    assert json.loads(before.stdout)["record"]["state"] == "stored_committed", before.stdout
    paged = await embedded(
        "result", iid, "--raw", "--from-chunk", "0", "--config", config, token=token
    )
    assert paged.returncode == 0 and paged.stdout == body, paged.stderr  # a page: nothing
    still = await embedded("record", iid, "--json", "--config", config, token=token)
    assert json.loads(still.stdout)["record"]["state"] == "stored_committed", still.stdout
    raw = await embedded("result", iid, "--raw", "--config", config, token=token)
    assert raw.returncode == 0 and raw.stdout == body, raw.stderr
    shown = await embedded("record", iid, "--json", "--config", config, token=token)
    after = json.loads(shown.stdout)
    assert after["record"]["state"] == "delivered_committed", after["record"]


async def test_a_removed_marker_is_result_unverified_through_the_daemon(
    tmp_path: Path, token: str
) -> None:
    """Its ``results`` row deleted, its RESULT_COMMITTED chained: the daemon's whole answer and
    its page both say RESULT_UNVERIFIED in ``verify``'s words, never ``result: null``, and
    the result stays undelivered (audit 54a: the whole read recorded RESULT_DELIVERED)."""
    import json
    import sqlite3

    body = b"z" * (1024 * 1024 + 3)  # over the inline limit: answered by reference
    async with serving(tmp_path, scripts.serve(Reply(200, body=body)), token=token) as (
        _srv,
        daemon,
    ):
        called = await cli(daemon, "call", "-", stdin=action_bytes("/r"))
        assert called.returncode == 0, called.stderr
        iid = called.json()["invocation_id"]
        conn = sqlite3.connect(daemon.journal, isolation_level=None)
        try:
            conn.execute("DELETE FROM results WHERE invocation_id = ?", (iid,))
        finally:
            conn.close()
        through = [
            await cli(daemon, "result", iid, *extra) for extra in ([], ["--from-chunk", "0"])
        ]
    stop(daemon)
    for run in through:
        assert _refusal(run) == (2, "RESULT_UNVERIFIED", None), run
        assert b"has no completeness marker (its results row was removed)" in run.stderr
        assert token.encode() not in run.stderr
    config = str(daemon.config)
    shown = await embedded("record", iid, "--json", "--config", config, token=token)
    assert json.loads(shown.stdout)["record"]["state"] == "stored_committed", shown.stdout
