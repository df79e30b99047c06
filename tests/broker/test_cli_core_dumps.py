"""Which commands run with core dumps forbidden (``affidavit.cli``, ``holds_secrets``): every
one that loads a credential, the broker key, the signing key, an auditor's private key or the
vault's key or values -- ``call``, ``result`` and the approvals only embedded, not as a thin
client of the daemon -- and no other.  Here in this process, ``forbid_core_dumps`` recorded
(``core_dumps_forbidden``, tests/conftest.py); a real child's settings are watched in
tests/daemon/test_core_dumps.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.cli import SECRETS_ALWAYS, SECRETS_EMBEDDED, SECRETS_NONE, build_parser, main
from tests.broker.test_cli_codes import _leaves

ALWAYS = {
    "init",
    "demo",
    "mcp",
    "serve",
    "operation poll",
    *(f"journal {c}" for c in ("public-key", "migrate", "reclaim", "audit-keygen")),
    *(f"journal {c}" for c in ("audit-open", "open-sealed", "holder")),
    *(f"vault {c}" for c in ("init", "put", "list", "lock", "unlock")),
}
EMBEDDED = {
    "call",
    "result",
    "reconcile",
    "approvals",
    "approvals show",
    "approvals approve",
    "approvals deny",
    "approvals revoke",
}
NONE = {
    "diagrams",
    "actions",
    "record",
    "sessions",
    "metrics",
    "operations",
    "console-url",
    "journal verify",
    "journal anchor",
}


def test_every_command_says_whether_it_holds_secrets() -> None:
    """A command added without saying is taken to hold secrets; this table makes it decide."""
    said: dict[str, set[str]] = {
        SECRETS_ALWAYS: set(),
        SECRETS_EMBEDDED: set(),
        SECRETS_NONE: set(),
    }
    for path, parser in _leaves(build_parser()):
        if "handler" in parser._defaults:
            said[parser._defaults.get("holds_secrets", "unsaid")].add(" ".join(path))
    assert said == {SECRETS_ALWAYS: ALWAYS, SECRETS_EMBEDDED: EMBEDDED, SECRETS_NONE: NONE}


def test_an_embedded_call_forbids_core_dumps_before_it_reads_its_config(
    core_dumps_forbidden: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["call", "--config", str(tmp_path / "none.toml")]) == 2
    assert "CONFIG" in capsys.readouterr().err
    assert core_dumps_forbidden == ["forbid"]


@pytest.mark.parametrize("how", ["--socket", "$AFFIDAVIT_SOCKET"])
def test_a_thin_client_call_leaves_the_process_alone(
    core_dumps_forbidden: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    socket = str(tmp_path / "nobody-listens.sock")
    action = tmp_path / "action.json"
    action.write_text('{"target": "api"}')
    argv = ["call", str(action)]
    if how == "--socket":
        argv += ["--socket", socket]
    else:
        monkeypatch.setenv("AFFIDAVIT_SOCKET", socket)
    assert main(argv) == 2  # DAEMON_UNAVAILABLE
    assert core_dumps_forbidden == []


@pytest.mark.parametrize(
    "argv",
    [
        ["actions", "--journal", "none.db"],
        # A login link is its own uid's (once, within 300 s, as the operator who asked): who
        # could read it in this process's memory or core could ask for one (docs/deployment.md).
        ["console-url", "--config", "none.toml"],
        ["console-url", "--socket", "nobody-listens.sock"],
    ],
)
def test_a_command_loading_no_secret_leaves_the_process_alone(
    core_dumps_forbidden: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2  # no journal, no config, no daemon
    assert core_dumps_forbidden == []


def test_what_could_not_be_done_is_a_warning_and_the_command_runs_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "affidavit.coredump.forbid_core_dumps", lambda: ["PR_SET_DUMPABLE refused (errno 1)"]
    )
    key = tmp_path / "signing.key"
    assert main(["journal", "public-key", "--signing-key", str(key)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "affidavit: warning: core dumps: PR_SET_DUMPABLE refused (errno 1)"
    assert "FILE_UNUSABLE" in err[1]  # the command ran: it found no key file
