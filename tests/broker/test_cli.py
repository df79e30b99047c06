"""``affidavit call | result | init`` as a caller sees them: exactly one envelope on stdout,
exit 0 (no error) / 1 (error envelope) / 2 (usage or config error, message on stderr, never a
traceback).  Real subprocesses against the hostile server on loopback."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import exposed_files
from affidavit.config import load_config
from affidavit.journal import JournalReader
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import TOKEN_ENV, http_target, signalled, write_config

LIMIT = 30


async def _cli(
    *args: str, stdin: bytes = b"", cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    full = {**os.environ, TOKEN_ENV: "cli-token-" + "x" * 8, **(env or {})}
    with trio.fail_after(LIMIT):
        return await trio.run_process(
            [sys.executable, "-m", "affidavit", *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=full,
            cwd=str(cwd) if cwd else None,
        )


def _one_envelope(out: bytes) -> dict[str, Any]:
    """stdout holds exactly one JSON document (raw_decode consumes it, only space remains)."""
    text = out.decode()
    doc, end = json.JSONDecoder().raw_decode(text.lstrip())
    assert text.lstrip()[end:].strip() == "", "more than one document on stdout"
    assert isinstance(doc, dict) and "invocation_id" in doc and "evidence" in doc
    return doc


def _no_traceback(p: subprocess.CompletedProcess[bytes]) -> None:
    assert b"Traceback" not in p.stderr and b"Traceback" not in p.stdout


GET = {"target": "api", "method": "GET", "path": "/hello"}


async def test_call_success_prints_one_envelope_and_exits_0(tmp_path: Path) -> None:
    async with HostileServer.running(scripts.serve(Reply(200, body=b'{"hi":1}'))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        action = tmp_path / "a.json"
        action.write_text(json.dumps(GET))
        p = await _cli("call", str(action), "--config", str(cfg))
    assert p.returncode == 0, p.stderr
    env = _one_envelope(p.stdout)
    assert "error" not in env
    assert env["result"]["status"] == 200 and env["result"]["body"] == '{"hi":1}'
    assert p.stderr == b""


async def test_call_reads_the_action_from_stdin(tmp_path: Path) -> None:
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        p = await _cli("call", "-", "--config", str(cfg), stdin=json.dumps(GET).encode())
        implicit = await _cli("call", "--config", str(cfg), stdin=json.dumps(GET).encode())
    assert p.returncode == 0 and implicit.returncode == 0
    assert len(srv.requests) == 2


async def test_call_error_envelope_exits_1(tmp_path: Path) -> None:
    async with HostileServer.running(scripts.serve(Reply(403, body=b"no"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        p = await _cli("call", "-", "--config", str(cfg), stdin=json.dumps(GET).encode())
    assert p.returncode == 1
    env = _one_envelope(p.stdout)
    assert env["error"]["code"] == "REMOTE_REJECTED"
    assert env["error"]["outcome"] == "rejected"


async def test_call_prints_the_envelope_of_errors_that_never_reach_delivery(
    tmp_path: Path,
) -> None:
    """Preflight, setup and unknown outcomes have no stored result to deliver; the CLI must
    still print their envelope (the bug: it printed nothing and exited 1)."""
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        cfg = write_config(
            tmp_path,
            {"api": http_target(srv.url), "down": http_target("http://127.0.0.1:1")},
        )
        cases = {
            "INVALID_TARGET": {"target": "nope", "method": "GET", "path": "/"},
            "CONNECTION_REFUSED": {"target": "down", "method": "GET", "path": "/"},
            "REMOTE_OUTCOME_UNKNOWN": {"target": "api", "method": "POST", "path": "/x"},
        }
        for code, action in cases.items():
            p = await _cli("call", "-", "--config", str(cfg), stdin=json.dumps(action).encode())
            assert p.returncode == 1, (code, p.stderr)
            assert p.stdout, (code, p.stderr)
            assert _one_envelope(p.stdout)["error"]["code"] == code
            _no_traceback(p)


async def test_call_timeout_flag_is_the_caller_deadline(tmp_path: Path) -> None:
    async with HostileServer.running(scripts.slow(3.0)) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        action = {"target": "api", "method": "POST", "path": "/slow"}
        p = await _cli(
            "call", "-", "--config", str(cfg), "--timeout", "0.3", stdin=json.dumps(action).encode()
        )
    assert p.returncode == 1
    err = _one_envelope(p.stdout)["error"]
    assert (err["code"], err["phase"], err["outcome"]) == (
        "CALLER_CANCELLED",
        "remote_execution",
        "unknown",
    )


async def test_call_usage_errors_exit_2_with_message_on_stderr(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:1")})
    cases: list[tuple[list[str], bytes, bytes]] = [
        (["call", "-", "--config", str(cfg)], b"{not json", b"at action: is not valid JSON"),
        (
            ["call", str(tmp_path / "missing.json"), "--config", str(cfg)],
            b"",
            b"cannot read action",
        ),
        (
            ["call", "-", "--config", str(tmp_path / "nope.toml")],
            b"{}",
            b"config file not found",
        ),
    ]
    bad_utf8 = tmp_path / "bad.json"
    bad_utf8.write_bytes(b'{"target": "\xff"}')
    cases.append((["call", str(bad_utf8), "--config", str(cfg)], b"", b"is not UTF-8"))
    broken_cfg = tmp_path / "broken.toml"
    broken_cfg.write_text('[targets.x]\nkind = "ftp"\n')
    cases.append((["call", "-", "--config", str(broken_cfg)], b"{}", b"targets.x.kind"))
    for args, stdin, message in cases:
        p = await _cli(*args, stdin=stdin)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert p.stdout == b""
        assert p.stderr.startswith(b"affidavit: ")
        assert message in p.stderr, (message, p.stderr)
        _no_traceback(p)


async def test_call_of_a_non_object_action_is_a_validation_envelope(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:1")})
    p = await _cli("call", "-", "--config", str(cfg), stdin=b"[1, 2]")
    assert p.returncode == 1
    err = _one_envelope(p.stdout)["error"]
    assert (err["code"], err["phase"], err["outcome"], err["field"]) == (
        "INVALID_FIELD",
        "validation",
        "not_attempted",
        "action",
    )


async def test_result_prints_the_stored_result_without_re_running(tmp_path: Path) -> None:
    async with HostileServer.running(scripts.serve(Reply(201, body=b'{"id":7}'))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        action = {"target": "api", "method": "POST", "path": "/make", "body": "{}"}
        first = await _cli("call", "-", "--config", str(cfg), stdin=json.dumps(action).encode())
        env = _one_envelope(first.stdout)
        again = await _cli("result", env["invocation_id"], "--config", str(cfg))
    assert again.returncode == 0, again.stderr
    stored = _one_envelope(again.stdout)
    assert stored["invocation_id"] == env["invocation_id"]
    assert stored["result"] == env["result"]
    assert len(srv.requests) == 1


async def test_result_of_an_error_exits_1_and_unknown_id_exits_2(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:1")})
    failed = await _cli(
        "call", "-", "--config", str(cfg), stdin=b'{"target":"api","method":"GET","path":"/"}'
    )
    iid = _one_envelope(failed.stdout)["invocation_id"]
    shown = await _cli("result", iid, "--config", str(cfg))
    assert shown.returncode == 1
    assert _one_envelope(shown.stdout)["error"]["code"] == "CONNECTION_REFUSED"
    missing = await _cli("result", "act_NOSUCHINVOCATION", "--config", str(cfg))
    assert missing.returncode == 2
    assert b"no invocation act_NOSUCHINVOCATION" in missing.stderr
    assert missing.stderr.startswith(b"affidavit: NO_SUCH_INVOCATION: "), missing.stderr
    for args in (("result", "act_NOSUCHINVOCATION", "--raw"), ("record", "act_NOSUCHINVOCATION")):
        other = await _cli(*args, "--config", str(cfg))
        assert other.returncode == 2 and other.stdout == b"", other
        assert other.stderr.startswith(b"affidavit: NO_SUCH_INVOCATION: "), other.stderr
    assert missing.stdout == b""


async def test_init_writes_a_loadable_config_and_an_empty_journal(tmp_path: Path) -> None:
    target = tmp_path / "fresh" / "affidavit.toml"
    target.parent.mkdir()
    p = await _cli("init", "--config", str(target))
    assert p.returncode == 0, p.stderr
    assert b"and an empty journal at" in p.stdout
    config = load_config(target)
    assert set(config.targets) == {"example", "deploy"}
    with JournalReader.open(config.journal.path) as reader:
        assert reader.list_actions() == []
        assert reader.verify().ok
    # Refuses to overwrite; --force does.
    again = await _cli("init", "--config", str(target))
    assert again.returncode == 2
    assert b"exists" in again.stderr
    forced = await _cli("init", "--config", str(target), "--force")
    assert forced.returncode == 0
    # The journal is never replaced, and the message says so (it said "an empty journal").
    assert b"kept the existing journal at" in forced.stdout, forced.stdout
    assert b"empty journal" not in forced.stdout


async def test_init_whose_journal_cannot_be_opened_says_its_config_is_written(
    tmp_path: Path,
) -> None:
    """The config is written before the journal is opened: when that fails (a database not
    reachable: nothing listens on loopback port 1), the refusal says so -- the same command
    again answered only FILE_EXISTS, with no word of where that file came from."""
    target = tmp_path / "affidavit.toml"
    url = "postgresql://affidavit@127.0.0.1:1/affidavit"
    p = await _cli("init", "--config", str(target), "--journal-url", url)
    assert p.returncode == 2 and p.stdout == b"", p
    assert p.stderr.startswith(b"affidavit: JOURNAL_UNAVAILABLE: "), p.stderr
    assert f"({target} is written all the same".encode() in p.stderr, p.stderr
    assert b"affidavit init --force" in p.stderr and target.is_file()
    assert load_config(target).journal.url == url


async def test_init_writes_its_config_private_whatever_the_umask(tmp_path: Path) -> None:
    """A new config is 0600 from its first byte: under a desktop's umask 002 it would be
    group-writable, which every command holding secrets refuses (CONFIG_EXPOSED); ``--force``
    puts a new one in its place with the mode its owner gave the old one."""
    target = tmp_path / "affidavit.toml"
    env = {**os.environ, TOKEN_ENV: "cli-token-" + "x" * 8}
    argv = [sys.executable, "-m", "affidavit", "init", "--config", str(target)]
    with trio.fail_after(LIMIT):
        p = await trio.run_process(
            argv,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            preexec_fn=lambda: os.umask(0o002),
        )
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert exposed_files(load_config(target)) == []
    target.chmod(0o640)
    forced = await _cli("init", "--config", str(target), "--force")
    assert forced.returncode == 0, forced.stderr
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


async def test_init_default_location_is_the_current_directory(tmp_path: Path) -> None:
    """Named absolutely, as every other command names a file (a config error's, the journal's
    in the same line): ``wrote affidavit.toml`` said nothing of where."""
    env = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_CONFIG"}
    (tmp_path / "etc").mkdir()
    for argv, config in (((), "affidavit.toml"), (("--config", "etc/a.toml"), "etc/a.toml")):
        p = await trio.run_process(
            [sys.executable, "-m", "affidavit", "init", *argv],
            cwd=str(tmp_path),
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert p.returncode == 0, p.stderr
        assert (tmp_path / config).is_file()
        journal = (tmp_path / config).parent / "affidavit.db"
        assert journal.is_file()
        said = f"wrote {tmp_path / config} and an empty journal at {journal}\n"
        assert p.stdout.decode().startswith(said), p.stdout


async def test_bad_timeout_and_non_utf8_identifiers_are_usage_errors(tmp_path: Path) -> None:
    # argv bytes that are not UTF-8 arrive as lone surrogates: binding one into SQLite raised
    # UnicodeEncodeError; a NaN or negative --timeout failed inside trio after ACTION_ACCEPTED.
    cfg = write_config(tmp_path, {"api": http_target("http://127.0.0.1:1")})
    journal = str(load_config(cfg).journal.path)
    bad = os.fsdecode(b"act_\xff")
    cases: list[tuple[list[str], bytes]] = [
        (["call", "-", "--config", str(cfg), "--timeout", "nan"], b"INVALID_FIELD at timeout"),
        (["call", "-", "--config", str(cfg), "--timeout", "-1"], b"INVALID_FIELD at timeout"),
        (["result", bad, "--config", str(cfg)], b"invocation id is not valid UTF-8"),
    ]
    p = await _cli("call", "-", "--config", str(cfg), stdin=json.dumps(GET).encode())
    assert p.returncode == 1  # creates the journal (connection refused envelope)
    for cmd in (["record", bad], ["actions", "--session", bad], ["metrics", "--session", bad]):
        cases.append(([*cmd, "--journal", journal], b"not valid UTF-8"))
    for args, message in cases:
        p = await _cli(*args, stdin=json.dumps(GET).encode())
        assert p.returncode == 2, (args, p.stderr)
        assert p.stderr.startswith(b"affidavit: ") and message in p.stderr, (args, p.stderr)
        assert b"\xff" not in p.stderr
        _no_traceback(p)
    with JournalReader.open(journal) as reader:
        assert len(reader.list_actions()) == 1  # the refused calls recorded nothing


async def test_sigterm_during_an_embedded_call_records_where_it_stood_and_exits_143(
    tmp_path: Path,
) -> None:
    """A supervisor's SIGTERM while the remote holds the request: the call is cancelled as
    Ctrl-C cancels it -- its record closed ``unknown`` (CALLER_CANCELLED), the request having
    been sent -- and the process ends with 143.  By default SIGTERM ended it at once and left
    the record open until some daemon's start-up recovery."""
    import signal

    post = {"target": "api", "method": "POST", "path": "/charge", "body": "{}"}
    async with HostileServer.running(scripts.held()) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, timeout={"total": 60})})
        env = {**os.environ, TOKEN_ENV: "cli-token-" + "x" * 8}
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "affidavit", "call", "-", "--config", str(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        try:
            assert proc.stdin is not None and proc.stderr is not None
            await proc.stdin.send_all(json.dumps(post).encode())
            await proc.stdin.aclose()
            with trio.fail_after(LIMIT):
                await srv.event("received").wait()
            code, said = await signalled(proc, signal.SIGTERM, LIMIT)
        finally:
            if proc.returncode is None:
                proc.kill()
    assert code == 143, said
    assert b"stopped by SIGTERM" in said and b"Traceback" not in said
    with JournalReader.open(load_config(cfg).journal.path) as r:
        (rec,) = r.list_actions()
    assert rec.outcome.value == "unknown" and rec.phase.value == "remote_execution"
    assert rec.code is not None and rec.code.value == "CALLER_CANCELLED"


def test_a_journal_refused_before_the_first_checkpoint_is_one_line_not_trios_crash() -> None:
    """``run_journal``'s SIGTERM watcher first runs after ``main``: a ``main`` refused at once
    (no checkpoint before the journal's refusal) left it iterating a closed receiver -- a
    ``TrioInternalError`` traceback instead of the refusal's one line."""
    from affidavit.cli import UsageError
    from affidavit.cli.call import run_journal
    from affidavit.journal import JournalError

    async def refused() -> None:
        raise JournalError("the journal refused at once")

    async def answered() -> int:
        return 7

    with pytest.raises(UsageError, match="the journal refused at once"):
        run_journal(refused)
    assert run_journal(answered) == 7
