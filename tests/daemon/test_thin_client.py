"""The thin client stays thin: ``affidavit call --socket`` loads the wire module, never the
engine, journal, config, cryptography, ssh, trio or even h11; ``affidavit --help`` loads no
command's implementation.  (Its speed is shown by tests/benchmarks/service_overhead.py, not
asserted.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from affidavit.cli.journal import OUTCOMES, PHASES
from affidavit.cli.vault import PASSPHRASE_ENV_SHOWN
from affidavit.secrets.vault import PASSPHRASE_ENV
from affidavit.statemachine import Outcome, Phase
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import action_bytes, api_target, client_env, run, running_daemon

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "affidavit.adapters",
    "affidavit.config",
    "affidavit.daemon",
    "affidavit.engine",
    "affidavit.journal",
    "affidavit.protocols",
    "affidavit.secrets",
    "affidavit.statemachine",
    "affidavit.views",
    "cryptography",
    "hypercorn",
    "ssh",
    "trio",
)

MODULES_AFTER = """
import json, sys
from affidavit.cli import main
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(status)
"""


def _loaded(stderr: bytes) -> list[str]:
    line = stderr.decode().rsplit("MODULES ", 1)[1]
    return list(json.loads(line))


def _heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(HEAVY)]


async def test_a_call_through_the_daemon_loads_nothing_of_the_broker(
    tmp_path: Path, token: str
) -> None:
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv,
        running_daemon(tmp_path, api_target(srv.url), token=token) as daemon,
    ):
        argv = ["-c", MODULES_AFTER, "call", "-", "--socket", str(daemon.socket)]
        done = await run([sys.executable, *argv], stdin=action_bytes(), env=client_env())
        # Nor the standard library it does not use (affidavit/__init__.py, wire.target,
        # cli._Formatter): seen with -S, so that no site-packages .pth loads them first.
        bare = await run(
            [sys.executable, "-S", *argv],
            stdin=action_bytes(),
            env={**client_env(), "PYTHONPATH": str(ROOT)},
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["result"]["status"] == 200
    assert bare.returncode == 0, bare.stderr
    assert json.loads(bare.stdout)["result"]["status"] == 200
    stdlib = set(_loaded(bare.stderr))
    # Nor ``logging``: the handler showing the config's warnings is for a config loaded here.
    unused = {"typing", "shutil", "urllib.parse", "ipaddress", "site", "logging"}
    assert not stdlib & unused, sorted(stdlib)
    modules = _loaded(done.stderr)
    assert "affidavit.api.wire" in modules
    assert _heavy(modules) == []
    # The one-shot request reads its answer itself (wire.py says why): not even h11.
    assert "h11" not in modules and "dataclasses" not in modules


@pytest.mark.parametrize("argv", [["--help"], ["call", "--help"], ["actions", "--help"]])
async def test_help_loads_no_command_implementation(argv: list[str]) -> None:
    done = await run([sys.executable, "-c", MODULES_AFTER, *argv], env=client_env())
    assert done.returncode == 0
    assert b"usage: affidavit" in done.stdout
    assert _heavy(_loaded(done.stderr)) == []


async def test_top_level_help_imports_no_command_module_and_says_what_they_declare() -> None:
    """``affidavit --help`` (and a command line naming no command) is built from
    ``cli.COMMAND_HELP`` alone: its text is the full parser's, byte for byte, and no command's
    module is imported to print it (issue 15: ``--help`` <= 150 ms)."""
    from affidavit.cli import COMMAND_MODULES, build_parser

    done = await run(
        [sys.executable, "-c", MODULES_AFTER, "--help"], env={**client_env(), "COLUMNS": "100"}
    )
    assert done.returncode == 0, done.stderr
    assert set(_loaded(done.stderr)).isdisjoint(COMMAND_MODULES)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "100")
        assert done.stdout.decode() == build_parser().format_help()
    typo = await run([sys.executable, "-c", MODULES_AFTER, "cal"], env=client_env())
    assert typo.returncode == 2
    assert b"INVALID_ARGUMENT: COMMAND: invalid choice: 'cal'" in typo.stderr, typo.stderr
    assert set(_loaded(typo.stderr)).isdisjoint(COMMAND_MODULES)


def test_the_help_list_is_what_the_command_modules_declare() -> None:
    """``COMMAND_HELP``, which ``affidavit --help`` prints without importing the modules, names
    every command in the order and with the words its module declares."""
    import argparse

    from affidavit.cli import COMMAND_HELP, build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {a.dest: a.help for a in sub._choices_actions} == COMMAND_HELP
    assert [a.dest for a in sub._choices_actions] == list(COMMAND_HELP)


def test_the_parser_spells_the_contract_and_vault_names_as_their_sources_do() -> None:
    """The command line writes these out rather than import them (module docstrings say why);
    they must not drift from the enums and the vault."""
    assert tuple(o.value for o in Outcome) == OUTCOMES
    assert tuple(p.value for p in Phase) == PHASES
    assert PASSPHRASE_ENV_SHOWN == PASSPHRASE_ENV


def test_the_command_map_names_what_each_module_declares() -> None:
    """``main`` builds only the running command's module (affidavit.cli.COMMANDS): the map must
    name every command the modules declare, each with the module that declares it."""
    import argparse

    from affidavit.cli import COMMANDS, build_parser

    def commands(parser: argparse.ArgumentParser) -> set[str]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return set(sub.choices)

    assert commands(build_parser()) == set(COMMANDS)
    for command, module in COMMANDS.items():
        assert command in commands(build_parser(command)), (command, module)
        assert commands(build_parser(command)) == {c for c, m in COMMANDS.items() if m == module}


@pytest.mark.parametrize("columns", ["44", "132"])
def test_help_is_wrapped_to_the_width_argparse_itself_would_use(
    monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    """``cli._Formatter`` finds the width without shutil; the help it formats is argparse's own,
    byte for byte, at any $COLUMNS."""
    import argparse

    from affidavit import cli

    monkeypatch.setenv("COLUMNS", columns)
    ours = cli.build_parser().format_help(), cli.build_parser("call").format_help()
    monkeypatch.setattr(cli, "_Formatter", argparse.HelpFormatter)
    assert (cli.build_parser().format_help(), cli.build_parser("call").format_help()) == ours
    assert max(len(line) for line in "\n".join(ours).splitlines()) <= int(columns)
