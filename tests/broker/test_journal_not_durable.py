"""A shared journal whose database may lose acknowledged commits (``fsync = off``) is refused
by the CLI with a stable code and the journal's words -- the setting and the fix -- never a
traceback, never a call sent on a DISPATCH_STARTED a crash could take back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import trio

from tests.http.hostile import HostileServer, Reply, scripts
from tests.postgres import running_cluster

from .helpers import http_target, write_config
from .test_journal_away_mid_call import ACTION, journal_table


async def test_affidavit_call_refuses_a_journal_with_fsync_off(tmp_path: Path) -> None:
    with running_cluster(fsync=False) as cluster:
        async with HostileServer.running(scripts.serve(Reply(201, body=b"{}"))) as srv:
            table = journal_table(tmp_path, cluster.database())
            cfg = write_config(tmp_path, {"api": http_target(srv.url)}, journal=table)
            with trio.fail_after(60):
                done = await trio.run_process(
                    [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
                    stdin=json.dumps(ACTION).encode(),
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            assert srv.requests == []
    err = done.stderr.decode()
    assert done.returncode == 2, (done.returncode, err)
    assert err.startswith("affidavit: JOURNAL_NOT_DURABLE: journal postgresql://"), err
    assert "fsync = off" in err and "set fsync = on" in err, err
    assert "Traceback" not in err and cluster.password not in err, err


async def test_affidavit_serve_refuses_a_journal_with_fsync_off(tmp_path: Path) -> None:
    # The daemon exits at start, before it listens: no socket for a call to reach, and the
    # operator reads the setting and the fix, not a traceback.
    sock = tmp_path / "d.sock"
    with running_cluster(fsync=False) as cluster:
        table = journal_table(tmp_path, cluster.database())
        cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:9")}, journal=table)
        serve = [sys.executable, "-m", "affidavit", "serve", "--config", str(cfg)]
        with trio.fail_after(60):
            done = await trio.run_process(
                [*serve, "--socket", str(sock)],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    err = done.stderr.decode()
    assert done.returncode == 2, (done.returncode, err)
    assert "affidavit: JOURNAL_NOT_DURABLE: journal postgresql://" in err, err
    assert "fsync = off" in err and "set fsync = on" in err, err
    assert "Traceback" not in err and cluster.password not in err, err
    assert not sock.exists()
