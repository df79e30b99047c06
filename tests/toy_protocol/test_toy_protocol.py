"""A protocol is added in one place (issue 8, item 5): the toy protocol, declared entirely in
this folder, gets config validation, ``affidavit call`` in a fresh process, diagrams and the
model checks without an edit anywhere else.

The CLI runs are real subprocesses that find the toy only through an installed entry point, and
talk to a scripted server on loopback; each asserts the envelope, what the server actually
acted on, and (seed: "never claim more than the records prove") the outcome the evidence allows.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.cli import main
from affidavit.config import ConfigError, config_from_dict
from affidavit.protocols import get, kinds
from affidavit.protocols.actions import ActionInvalid, fingerprint, is_idempotent, parse_action
from affidavit.statemachine import Code
from affidavit.statemachine import registered as registered_tables
from tests.statemachine.test_model_check import (
    check_every_pair_is_declared_or_refused,
    protocol_tables,
)

from . import PROTOCOL, TOY_TABLE, ToyAction, ToyTarget
from .server import toy_server

TOKEN = "toy-Secret-7c1e9f"
LIMIT = 60


def _config(**over: Any) -> dict[str, Any]:
    box = {"kind": "toy", "port": 7000, "credential": "env:TOY_TOKEN", **over}
    return {"targets": {"box": {k: v for k, v in box.items() if v is not None}}}


# --- config validation -----------------------------------------------------------------------


@pytest.mark.usefixtures("toy_registered")
def test_a_toy_target_loads_through_its_own_schema() -> None:
    config = config_from_dict(_config(idempotent_lines=["status"]), base_dir=Path("/x"))
    box = config.targets["box"]
    assert isinstance(box, ToyTarget)
    assert (box.host, box.port, box.budget, box.timeout.total) == ("127.0.0.1", 7000, 3, 60.0)
    assert box.idempotent_lines == {"status"}


@pytest.mark.parametrize(
    ("over", "field", "message"),
    [
        ({"port": None}, "targets.box.port", "is required"),
        ({"port": 0}, "targets.box.port", "must be between 1 and 65535"),
        ({"host": "a b"}, "targets.box.host", "is not a valid host name"),
        ({"credential": "TOKEN"}, "targets.box.credential", "must be env:NAME"),
        ({"budget": 0}, "targets.box.budget", "must be between 1 and 100"),
        ({"timeout": {"connect": 9, "total": 1}}, "targets.box.timeout.connect", "must not"),
        ({"idempotent_lines": "x"}, "targets.box.idempotent_lines", "must be an array"),
        (
            {"colour": "red"},
            "targets.box.colour",
            "unknown setting (allowed: kind, description, host, port, credential, budget, "
            "timeout, max_result, idempotent_lines, trust_file)",
        ),
    ],
)
@pytest.mark.usefixtures("toy_registered")
def test_bad_toy_settings_are_config_errors_with_the_field_path(
    over: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(_config(**over), base_dir=Path("/x"))
    assert info.value.field == field
    assert info.value.message.startswith(message)


@pytest.mark.usefixtures("toy_registered")
def test_the_kind_error_lists_the_toy_among_the_protocols() -> None:
    assert "toy" in kinds()
    with pytest.raises(ConfigError) as info:
        config_from_dict({"targets": {"x": {"kind": "ftp"}}}, base_dir=Path("/x"))
    assert info.value.field == "targets.x.kind"
    assert info.value.message == 'must be "http", "ssh" or "toy"'


# --- actions -----------------------------------------------------------------------------------


@pytest.mark.usefixtures("toy_registered")
def test_toy_actions_parse_fingerprint_and_idempotency_through_the_registry() -> None:
    config = config_from_dict(_config(idempotent_lines=["status"]), base_dir=Path("/x"))
    box = config.targets["box"]
    status = parse_action({"target": "box", "line": "status", "session": "s"}, config)
    assert status == ToyAction(target="box", line="status", session="s")
    assert is_idempotent(status, box)
    deploy = parse_action({"target": "box", "line": "deploy"}, config)
    assert not is_idempotent(deploy, box)
    assert fingerprint(deploy, box, "h") != fingerprint(status, box, "h")
    for action, code, field in [
        ({"target": "box"}, Code.MISSING_FIELD, "line"),
        ({"target": "box", "line": "a\nb"}, Code.INVALID_FIELD, "line"),
        ({"target": "box", "line": "x", "colour": 1}, Code.INVALID_FIELD, "colour"),
        # another protocol's field is a different kind of action, not a typo
        ({"target": "box", "line": "x", "command": "ls"}, Code.UNSUPPORTED_ACTION, "command"),
    ]:
        with pytest.raises(ActionInvalid) as info:
            parse_action(action, config)
        assert (info.value.code, info.value.field) == (code, field)


# --- affidavit call, in a fresh process --------------------------------------------------------


class _Cli:
    def __init__(self, tmp: Path, env: dict[str, str], port: int, extra: str = "") -> None:
        self.tmp = tmp
        self.env = {**env, "TOY_TOKEN": TOKEN}
        self.cfg = tmp / "affidavit.toml"
        self.cfg.write_text(
            f'[journal]\npath = "journal.db"\n\n[targets.box]\nkind = "toy"\nport = {port}\n'
            'credential = "env:TOY_TOKEN"\ntimeout = { connect = 5, total = 10 }\n' + extra,
            encoding="utf-8",
        )
        self.outputs: list[bytes] = []

    async def call(self, line: str) -> tuple[int, dict[str, Any]]:
        action = self.tmp / "action.json"
        action.write_text(json.dumps({"target": "box", "line": line}), encoding="utf-8")
        cmd = [sys.executable, "-m", "affidavit", "call", str(action), "--config", str(self.cfg)]
        with trio.fail_after(LIMIT):
            p = await trio.run_process(
                cmd, capture_stdout=True, capture_stderr=True, check=False, env=self.env
            )
        self.outputs += [p.stdout, p.stderr]
        assert b"Traceback" not in p.stderr, p.stderr
        return p.returncode, json.loads(p.stdout)


async def test_affidavit_call_runs_a_toy_action_found_through_an_entry_point(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    async with toy_server(TOKEN.encode()) as server:
        cli = _Cli(tmp_path, plugin_env, server.port)
        rc, env = await cli.call("hello")
    assert rc == 0, env
    assert env["result"]["stdout"] == "hello\n"
    assert env["result"]["status"] == 0
    assert env["evidence"]["dispatch_started"] is True
    assert server.ran == [b"hello"]
    assert all(TOKEN.encode() not in out for out in cli.outputs)


@pytest.mark.parametrize(
    ("script", "token", "ran", "error"),
    [
        # the server acted and closed without END: nothing proves the outcome either way
        ("vanish", TOKEN, [b"hello"], ("REMOTE_OUTCOME_UNKNOWN", "remote_execution", "unknown")),
        # refused at AUTH, before the RUN line: proven not attempted
        ("ok", "wrong", [], ("REMOTE_AUTH_FAILED", "connection_setup", "not_attempted")),
        # a complete result that failed is committed, not "failed"
        ("fail", TOKEN, [b"hello"], ("REMOTE_COMMAND_FAILED", "remote_execution", "committed")),
    ],
)
async def test_affidavit_call_reports_what_the_toy_evidence_proves(
    tmp_path: Path,
    plugin_env: dict[str, str],
    script: str,
    token: str,
    ran: list[bytes],
    error: tuple[str, str, str],
) -> None:
    async with toy_server(token.encode(), script) as server:
        rc, env = await _Cli(tmp_path, plugin_env, server.port).call("hello")
    assert rc == 1
    assert (env["error"]["code"], env["error"]["phase"], env["error"]["outcome"]) == error
    assert server.ran == ran


async def test_a_toy_result_past_max_result_is_cut_by_the_engine_alone(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    # The toy driver knows nothing of max_result: the engine's sink bounds every protocol's
    # result, and its ResultTooLarge ends the attempt as the records prove.
    async with toy_server(TOKEN.encode()) as server:
        rc, env = await _Cli(tmp_path, plugin_env, server.port, "max_result = 4\n").call("hello")
    assert rc == 1
    error = (env["error"]["code"], env["error"]["phase"], env["error"]["outcome"])
    assert error == ("RESULT_SIZE_LIMIT", "remote_execution", "unknown")
    # Cut short: its last bytes withheld whatever they were, so its counts too.
    over = {"limit": 4, "received_withheld": "tail_redacted"}
    assert env["evidence"]["result_size_limit"] == over
    assert "result" not in env and server.ran == [b"hello"]


async def test_a_token_echoed_by_the_toy_server_is_redacted(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    async with toy_server(TOKEN.encode(), "echo-token") as server:
        cli = _Cli(tmp_path, plugin_env, server.port)
        rc, env = await cli.call("hello")
    assert rc == 0
    assert env["result"]["stdout"] == "[REDACTED]\n"
    assert all(TOKEN.encode() not in out for out in cli.outputs)
    assert TOKEN.encode() not in (tmp_path / "journal.db").read_bytes()


async def _affidavit(
    args: list[str], env: dict[str, str], stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    """``python -m affidavit ARGS`` in a fresh process with ``env``, within ``LIMIT``."""
    with trio.fail_after(LIMIT):
        return await trio.run_process(
            [sys.executable, "-m", "affidavit", *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )


async def test_a_bad_toy_setting_stops_the_cli_with_the_field_path(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text('[targets.box]\nkind = "toy"\nport = 0\ncredential = "env:T"\n')
    p = await _affidavit(["call", "--config", str(cfg)], plugin_env, stdin=b"{}")
    assert p.returncode == 2
    assert p.stderr.decode() == (
        f"affidavit: CONFIG_INVALID: {cfg}: targets.box.port: must be between 1 and 65535\n"
    )


# --- trust anchors ------------------------------------------------------------------------------


def _anchored(tmp: Path, mode: int) -> tuple[Path, Path]:
    """A config whose toy target names a trust file of ``mode``, and that file."""
    trusted = tmp / "toy-trust"
    trusted.write_text("toy-server\n")
    trusted.chmod(mode)
    cfg = tmp / "affidavit.toml"
    cfg.write_text(
        f'[journal]\npath = "{tmp / "journal.db"}"\n[targets.box]\nkind = "toy"\nport = 7000\n'
        f'credential = "env:T"\ntrust_file = "{trusted}"\n'
    )
    return cfg, trusted


async def test_an_installed_protocols_trust_anchor_is_checked_at_start_without_an_edit(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    """The toy declares ``trust_file`` a trust anchor (``Field.trust_anchor``): ``affidavit
    serve``, finding the toy only through its entry point, refuses while its group can write
    it -- with no edit to journal/exposure.py or the broker."""
    cfg, trusted = _anchored(tmp_path, 0o664)
    p = await _affidavit(["serve", "--config", str(cfg)], plugin_env)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert err.startswith("affidavit: FILES_EXPOSED: "), err
    want = f"toy trust file of target box {trusted} is writable by group or others (mode 0664)"
    assert f"{want}: chmod 644 {trusted} -- " in err, err
    assert "toy-server" not in err and "Traceback" not in err


@pytest.mark.usefixtures("toy_registered")
def test_a_toy_trust_file_others_may_only_read_says_nothing(tmp_path: Path) -> None:
    from affidavit.api.broker import exposed_files
    from affidavit.config import load_config

    cfg, trusted = _anchored(tmp_path, 0o644)
    assert exposed_files(load_config(cfg)) == []
    trusted.chmod(0o646)
    assert [e.path for e in exposed_files(load_config(cfg))] == [trusted]


# --- diagrams and model checks -----------------------------------------------------------------


@pytest.mark.usefixtures("toy_registered")
def test_the_diagrams_draw_the_registered_toy_table(tmp_path: Path) -> None:
    # On request: the repository's committed set is its own protocols (test_toy_diagrams.py).
    assert main(["diagrams", "--all-protocols", "--root", str(tmp_path)]) == 0
    mmd = (tmp_path / "diagrams/protocol-toy.mmd").read_text()
    assert "running" in mmd and "dispatch" in mmd
    assert (tmp_path / "diagrams/protocol-toy.dot").is_file()
    assert (
        "`toy` ([diagram](../diagrams/protocol-toy.mmd))"
        in (tmp_path / "docs/contract.md").read_text()
    )


def test_an_unregistered_toy_is_not_drawn(tmp_path: Path) -> None:
    assert get("toy") is None
    assert "toy" not in registered_tables()
    assert main(["diagrams", "--root", str(tmp_path)]) == 0
    assert not (tmp_path / "diagrams/protocol-toy.mmd").exists()


@pytest.mark.usefixtures("toy_registered")
def test_the_model_checks_cover_the_registered_toy_table() -> None:
    assert get("toy") is PROTOCOL
    assert TOY_TABLE in protocol_tables()
    assert TOY_TABLE.problems() == []
    check_every_pair_is_declared_or_refused(TOY_TABLE)


async def test_an_installed_protocol_gets_its_mcp_tool_without_an_edit(
    tmp_path: Path, plugin_env: dict[str, str]
) -> None:
    """``affidavit mcp`` offers ``toy_call`` -- the protocol declares no field schema, so the
    tool's names its fields and leaves their form to the toy's parser -- and runs it."""
    from tests.mcp.kit import connected, structured

    async with toy_server(TOKEN.encode()) as server:
        cli = _Cli(tmp_path, plugin_env, server.port)
        args = ["--config", str(cli.cfg)]
        async with connected(args, cli.env, tmp_path / "mcp.log") as mcp:
            tools = {t.name: t for t in (await mcp.session.list_tools()).tools}
            schema = tools["toy_call"].input_schema
            assert schema["properties"]["target"]["enum"] == ["box"]
            assert set(schema["properties"]) == {"target", "line", "session"}
            done = await mcp.call("toy_call", {"target": "box", "line": "hello"})
            refused = await mcp.call("toy_call", {"target": "box", "line": "\x01"})
    assert done.is_error is False
    assert structured(done)["result"]["stdout"] == "hello\n"
    assert structured(refused)["error"]["field"] == "line"
    assert server.ran == [b"hello"]
