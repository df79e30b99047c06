"""``affidavit result`` run embedded, as the daemon, MCP and the console answer it
(tests/daemon/test_fetch_read_declined.py): a read the database declined this once
(``ReadFailed``: a statement timeout, a lock not granted) exits 2 as JOURNAL_READ_DECLINED --
the same read may succeed -- never JOURNAL_UNUSABLE, which says the journal's file, directory or
key cannot be used as this user and sends an operator looking for a fault that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from affidavit.cli import main as cli_main
from tests.http.hostile import HostileServer, Reply, scripts
from tests.journal.helpers import decline_record_once

from .helpers import TOKEN_ENV, http_target, open_broker, write_config


def test_an_embedded_result_whose_read_is_declined_once_exits_read_declined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(TOKEN_ENV, "unused-token")

    async def one_call() -> tuple[str, int]:
        async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
            cfg = write_config(tmp_path, {"api": http_target(srv.url)})
            with trio.fail_after(10):
                async with open_broker(cfg) as b:
                    env = await b.call({"target": "api", "method": "GET", "path": "/r"})
            return str(env["invocation_id"]), len(srv.requests)

    iid, sent = trio.run(one_call)
    cfg = tmp_path / "affidavit.toml"
    assert cfg.exists()
    declined = decline_record_once(monkeypatch, iid)
    capsys.readouterr()
    code = cli_main(["result", "--config", str(cfg), iid])
    err = capsys.readouterr().err
    again = cli_main(["result", "--config", str(cfg), iid])
    assert declined == [iid]
    assert code == 2 and "JOURNAL_READ_DECLINED" in err and "JOURNAL_UNUSABLE" not in err, err
    assert again == 0
    assert sent == 1
