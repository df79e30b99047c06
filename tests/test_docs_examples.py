"""The examples in README.md and docs/*.md are what a newcomer types first: every TOML block
that is an ``affidavit.toml`` (or a fragment of one) validates, and every ``affidavit ...``
command shown names a command and flags that exist.  So an example cannot rot silently when
a setting or a flag is renamed."""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import shlex
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from affidavit.cli import ArgvRefused, build_parser
from affidavit.config import config_from_dict

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
SECTIONS = {"journal", "vault", "service", "targets"}

# A fragment (``# ...`` for the settings it leaves out) is completed with a target of its
# kind; these are what a fragment's own keys are laid over.
BASES: dict[str, dict[str, Any]] = {
    "http": {
        "kind": "http",
        "url": "https://api.example.com/v1",
        "methods": ["GET", "POST", "DELETE"],
        "credential": "env:TOKEN",
    },
    "ssh": {
        "kind": "ssh",
        "host": "deploy.example.com",
        "user": "deploy",
        "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + "A" * 43,
        "credential": "env:KEY",
    },
}
SSH_KEYS = {"host", "user", "host_key", "known_hosts", "command", "commands", "except_commands"}


def _blocks(lang: str) -> Iterator[tuple[str, str]]:
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) == lang:
                line = text.count("\n", 0, m.start()) + 1
                yield f"{doc.relative_to(ROOT)}:{line}", m.group(2)


def _kind(table: dict[str, Any]) -> str:
    if "kind" in table:
        return str(table["kind"])
    flat = set(table) | {k for v in table.values() if isinstance(v, dict) for k in v}
    return "ssh" if flat & SSH_KEYS else "http"


def _completed(data: dict[str, Any]) -> dict[str, Any]:
    """A fragment's targets laid over a whole target of their kind; a ``[vault]`` for a
    ``vault:`` credential and an operator for an ``approval`` when the fragment has none."""
    data = dict(data)
    targets = {n: {**BASES[_kind(t)], **t} for n, t in data.get("targets", {}).items()}
    if targets:
        data["targets"] = targets
    if any(str(t.get("credential", "")).startswith("vault:") for t in targets.values()):
        data.setdefault("vault", {"path": "affidavit.vault"})
    if any("approval" in t for t in targets.values()):
        service = data.setdefault("service", {})
        if not service.get("operator_gids"):
            service.setdefault("operator_uids", [1001])
    return data


TOML = list(_blocks("toml"))


@pytest.mark.parametrize("where", [w for w, _ in TOML])
def test_every_documented_config_block_validates(where: str, tmp_path: Path) -> None:
    body = dict(TOML)[where]
    data = tomllib.loads(body)
    if not set(data) <= SECTIONS:
        assert "project" in data, (where, sorted(data))  # a pyproject.toml fragment
        return
    config_from_dict(_completed(data), base_dir=tmp_path)


SET_ONLY = re.compile(r"\$\{\w+:\+([^}]*)\}")
"""``${VAR:+words}``: the words if VAR is set and not empty, else nothing (docs' cron recipes)."""


def _argvs(command: str) -> list[list[str]]:
    """A documented command line as argv, one per alternative of its ``a|b`` word (a
    ``show|approve|deny ... [--note ...]`` line holds if one of them takes the rest):
    placeholders kept as values, ``[--opt]`` optional parts included, comments and
    redirections dropped; a shell's ``${VAR:+words}`` (the words when VAR is set) as its words."""
    words = shlex.split(SET_ONLY.sub(r"\1", command), comments=True)[1:]
    argv: list[str] = []
    skip = False
    choices: tuple[int, list[str]] | None = None
    for word in words:
        if skip:
            skip = False
            continue
        if word in (">", "<", "2>"):
            skip = True
            continue
        if word.startswith(("<", ">")):
            continue
        word = word.strip("[]")
        if "|" in word and not word.startswith("-") and choices is None:
            choices = (len(argv), word.split("|"))
        if word:
            argv.append(word)
    if choices is None:
        return [argv]
    at, options = choices
    return [[*argv[:at], option, *argv[at + 1 :]] for option in options]


def _refusal(argv: list[str]) -> str | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except ArgvRefused as exc:
        return exc.message
    except SystemExit as exc:  # --help: not a refusal
        assert not exc.code, exc
    return None


# What a shell line puts before the command it runs: ``VAR=value`` assignments (docs/mcp.md's
# ``AFFIDAVIT_DAEMON_UID=affidavit affidavit mcp ...``), ``sudo -u USER`` and util-linux's
# ``setpriv --reuid ... --groups ...`` (docs/deployment.md): the command after them is checked too.
LAUNCHER = re.compile(
    r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+"
    r"|^sudo(?:\s+-[ug]\s+\S+)*\s+"
    r"|^setpriv\s.*?(?=\baffidavit\s+(?!affidavit\b)[a-z])"
)


def _commands() -> Iterator[tuple[str, str, bool]]:
    """(where, command, whole): fenced shell lines are whole commands; an inline mention in
    prose (`affidavit result`) may leave out a required argument."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            if m.group(1) not in ("sh", "bash", ""):
                continue
            start = text.count("\n", 0, m.start()) + 2
            body = re.sub(r"\\\n\s*", " ", m.group(2))
            for n, line in enumerate(body.splitlines()):
                for part in re.split(r"\|(?=\s)|&&|;", line):
                    part = LAUNCHER.sub("", part.strip())
                    if part.startswith("affidavit "):
                        yield f"{doc.relative_to(ROOT)}:{start + n}", part, True
        for m in re.finditer(r"`(affidavit [^`]*)`", text):
            yield f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}", m[1], False


PROSE_ONLY = ("are required", "expected one argument")


def test_every_documented_command_and_flag_exists() -> None:
    bad = []
    for where, command, whole in _commands():
        refusals = [_refusal(argv) for argv in _argvs(command)]
        if None in refusals:
            continue
        if not whole and all(any(p in r for p in PROSE_ONLY) for r in refusals if r):
            continue
        bad.append(f"{where}: {command!r}: {refusals}")
    assert bad == []


def test_the_documented_systemd_unit_can_read_the_documented_config_directory() -> None:
    """docs/deployment.md makes /etc/affidavit ``root:affidavit 0750`` and runs the daemon as
    ``User=affidavit`` with ``Group=affidavit-clients``.  With ``Group=`` set, systemd gives
    the process that group and the groups that list the user as a member (initgroups), not
    the user's own group from /etc/passwd: the unit must name the directory's group."""
    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    owner = re.search(r"install -d -o \S+ -g (\S+) -m 0750 /etc/affidavit", text)
    assert owner is not None
    (unit,) = [body for lang, body in FENCE.findall(text) if lang == "ini"]
    groups = set()
    for key in ("Group", "SupplementaryGroups"):
        for m in re.finditer(rf"^{key}=(.*)$", unit, re.M):
            groups.update(m[1].split())
    assert owner[1] in groups, (owner[1], groups)


def test_no_doc_installs_the_project_from_a_package_index() -> None:
    """This project is installed from its checkout (README: ``pip install -e .``): a bare
    ``pip install affidavit`` where it is not installed yet would fetch whatever an index
    holds under that name.  (An extra, ``'affidavit[mcp]'``, resolves against the installed
    project.)"""
    bare = re.compile(r"pip install affidavit(?![\w\[-])")
    found = [
        f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
        for doc in DOCS
        for text in [doc.read_text(encoding="utf-8")]
        for m in bare.finditer(text)
    ]
    assert found == []


def test_the_readme_vault_steps_store_the_token(tmp_path: Path) -> None:
    """README's "Using it" keeps the token in the vault instead of the environment with one
    chain of commands: run as written (each passphrase given on stdin, as a terminal would
    be asked for it, the passphrase variable unset), every step succeeds -- ``vault put``
    refuses a vault nobody unlocked."""
    import os
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if "affidavit vault init &&" in ln)
    chain = [part.strip() for part in line[line.index("affidavit vault init") :].split("&&")]
    env = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_VAULT_PASSPHRASE"}
    base = [sys.executable, "-m", "affidavit"]
    done = subprocess.run([*base, "init"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for command in chain:
        argv = shlex.split(command)[1:]
        asks = argv[1] in ("init", "unlock")
        stdin = b"pass phrase\n" if asks else b"tok-1"
        argv += ["--passphrase-stdin"] if asks else []
        done = subprocess.run(
            [*base, *argv], cwd=tmp_path, env=env, input=stdin, capture_output=True, timeout=60
        )
        assert done.returncode == 0, (command, done.stderr.decode())
    assert (
        b"example_token\tv1"
        in subprocess.run(
            [*base, "vault", "list"], cwd=tmp_path, env=env, capture_output=True, timeout=60
        ).stdout
    )


def test_the_deployment_vault_steps_work_in_their_order(tmp_path: Path) -> None:
    """docs/deployment.md's vault steps for the daemon's user (``sudo -u affidavit affidavit
    vault ... --config ...``, then ``... vault ...``), run in the order written against a
    config of our own: each succeeds."""
    import os
    import subprocess
    import sys

    text = (ROOT / "docs" / "deployment.md").read_text(encoding="utf-8")
    para = text[text.index("A vault is managed as the daemon's user") :].split("\n\n")[0]
    steps = re.findall(r"`(?:sudo -u \S+ affidavit|\.\.\.) (vault [^`]*)`", para.replace("\n", " "))
    assert len(steps) >= 2, para
    env = {k: v for k, v in os.environ.items() if k != "AFFIDAVIT_VAULT_PASSPHRASE"}
    base = [sys.executable, "-m", "affidavit"]
    done = subprocess.run([*base, "init"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for step in steps:
        argv = [a for a in shlex.split(step) if a != "--config" and not a.startswith("/etc/")]
        asks = argv[1] in ("init", "unlock")
        argv += ["--passphrase-stdin"] if asks else []
        done = subprocess.run(
            [*base, *argv, "--config", str(tmp_path / "affidavit.toml")],
            env=env,
            input=b"pass phrase\n" if asks else b"tok-1",
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, (step, done.stderr.decode())


# What ``journal holder`` and ``journal open-sealed`` print, line by line: docs/journal.md's
# example output and the program's own must both have these shapes, so neither drifts alone.
SHAPES = {
    "journal holder": [
        r"invocation act_\S+: \d+ lease holder\(s\) recorded",
        r"  [^ :]+:\d+:[0-9a-f]+",
        r"    shown as hmac-sha256:[0-9a-f]+…?",
        r"    in \d+ [A-Z_]+(, \d+ [A-Z_]+)*",
    ],
    "journal open-sealed": [
        r"invocation act_\S+: \d+ payload\(s\) opened with \S+",
        r" +\d+  \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z  [A-Z_]+",
        r" {12}\{.*\}",
        r" {12}detail: .+",
    ],
}


def _shown_output(command: str) -> list[str]:
    """The untyped block right after the ``sh`` block that runs ``affidavit <command>``."""
    text = (ROOT / "docs" / "journal.md").read_text(encoding="utf-8")
    blocks = list(FENCE.finditer(text))
    for m, after in itertools.pairwise(blocks):
        if m.group(1) == "sh" and f"affidavit {command} " in m.group(2) and after.group(1) == "":
            return after.group(2).splitlines()
    raise AssertionError(f"docs/journal.md shows no output of `affidavit {command}`")


def _unshaped(command: str, lines: list[str]) -> list[str]:
    return [ln for ln in lines if not any(re.fullmatch(p, ln) for p in SHAPES[command])]


def test_the_documented_holder_and_sealed_output_is_what_the_commands_print(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One invocation whose credential is missing (nothing is sent): ``journal holder`` lists its
    holder, maps the shown tag back, and ``journal open-sealed`` opens the accepted action and
    the CREDENTIAL_FAILED detail -- each line in a shape the docs' example has too.  A missing
    key file is refused with its code and the fix."""
    import trio

    from affidavit.api.broker import Broker
    from affidavit.cli import main as cli_main
    from affidavit.config import load_config
    from tests.broker.helpers import write_config

    monkeypatch.delenv("AFF_DOCS_UNSET", raising=False)
    target = {"kind": "http", "url": "http://127.0.0.1:9", "methods": ["GET"]}
    cfg = write_config(tmp_path, {"api": {**target, "credential": "env:AFF_DOCS_UNSET"}})

    async def call() -> dict[str, Any]:
        with trio.fail_after(15):
            async with Broker.open(config=load_config(cfg)) as broker:
                return await broker.call({"target": "api", "method": "GET", "path": "/"})

    env = trio.run(call)
    assert env["error"]["code"] == "CREDENTIAL_MISSING", env
    iid, shown = env["invocation_id"], env["evidence"]["lease"]["holder"]

    def run(*argv: str) -> tuple[int, list[str], str]:
        code = cli_main([*argv, "--config", str(cfg)])
        done = capsys.readouterr()
        return code, done.out.splitlines(), done.err

    for command in SHAPES:
        doc = _shown_output(command)
        assert doc and _unshaped(command, doc) == [], doc
        code, out, err = run(*command.split(), iid)
        assert code == 0 and out and err == "", (out, err)
        assert _unshaped(command, out) == [], out
        # every shape the docs show, the program prints (and the other way round)
        used = {p for p in SHAPES[command] for ln in out if re.fullmatch(p, ln)}
        assert used == {p for p in SHAPES[command] for ln in doc if re.fullmatch(p, ln)}
    code, out, err = run("journal", "holder", iid, shown)
    assert code == 0 and len(out) == 1 and re.fullmatch(SHAPES["journal holder"][1][2:], out[0])
    code, out, err = run("journal", "holder", iid, "hmac-sha256:00")
    assert (code, out) == (2, []) and err.startswith("affidavit: NO_SUCH_HOLDER: "), err
    code, out, err = run("journal", "holder", iid, "--key-file", str(tmp_path / "absent.key"))
    assert (code, out) == (2, []) and err.startswith("affidavit: FILE_UNUSABLE: "), err
    assert "--key-file FILE, or --config" in err and "Traceback" not in err, err


def _documented_signatures() -> dict[str, Any]:
    from affidavit import Client
    from affidavit.adapters.base import AttemptInterrupted, RemoteResult, SetupError
    from affidavit.protocols.spec import (
        ActionField,
        ActionSpec,
        ProtocolSpec,
        ReconcileContract,
        ResultContracts,
    )

    return {
        c.__name__: c
        for c in (
            ActionField,
            ActionSpec,
            AttemptInterrupted,
            Client,
            ProtocolSpec,
            ReconcileContract,
            RemoteResult,
            ResultContracts,
            SetupError,
        )
    }


def test_every_documented_constructor_names_its_parameters_and_the_required_ones() -> None:
    """A doc that shows ``ReconcileContract(query=…, verdict=…)`` or ``SetupError(code, stage)``
    teaches a plugin author to write exactly that: every keyword it names is a parameter, a
    positional placeholder is the parameter's own name at that place, and no required parameter
    is left out (a left-out one is a TypeError the first time the author's code runs)."""
    import inspect

    known = _documented_signatures()
    call = re.compile(r"\b(" + "|".join(known) + r")\(([^()`]*)\)")
    bad, seen = [], set()
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in call.finditer(text):
            where = f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            params = list(inspect.signature(known[m[1]]).parameters.values())
            named: set[str] = set()
            args = [a.strip() for a in m[2].replace("\n", " ").split(",") if a.strip()]
            for i, arg in enumerate(args):
                kw = re.match(r"(\w+)\s*=", arg)
                if kw:
                    name = kw[1]
                elif re.fullmatch(r"\w+", arg) and i < len(params):
                    name = arg
                    if params[i].name != name:
                        bad.append(f"{where}: {m[0]}: argument {i} is {params[i].name!r}")
                else:
                    name = params[i].name if i < len(params) else "?"
                named.add(name)
            names = {p.name for p in params}
            required = {
                p.name for p in params if p.default is p.empty and p.kind is not p.VAR_KEYWORD
            }
            if named - names:
                bad.append(f"{where}: {m[0]}: no parameter {sorted(named - names)}")
            if required - named:
                bad.append(f"{where}: {m[0]}: leaves out required {sorted(required - named)}")
            seen.add(m[1])
    assert bad == []
    assert {"ReconcileContract", "ResultContracts", "SetupError", "Client"} <= seen, seen


def test_every_file_and_test_a_doc_points_to_exists() -> None:
    """ "The code is `affidavit/secrets/redaction.py`", "proven by
    `test_exit_signal_is_committed_...`": a reader follows these to check a promise.  Every
    repository path a doc names (``adapters/ssh/driver.py``, ``tests/mcp/test_tools.py``;
    ``affidavit/`` may be left out, as in ``secrets/redaction_plan.py``, or added, as in
    ``affidavit/statemachine``) is there, and every test
    named (a ``test_`` word; one ending in ``…`` is a prefix) is a test function or a test file."""
    roots = "affidavit|adapters|journal|statemachine|tests|docs|diagrams|benchmarks|secrets"
    path = re.compile(rf"(?<![\w/.-])((?:{roots})/[\w./-]*\w)")
    tests = ROOT / "tests"
    defined = {
        m[1]
        for f in tests.rglob("*.py")
        for m in re.finditer(r"^\s*(?:async )?def (test_\w+)", f.read_text(encoding="utf-8"), re.M)
    } | {f.stem for f in tests.rglob("test_*.py")}
    bad = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in path.finditer(text):
            where = f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            if text.startswith("-<", m.end()):  # a pattern: diagrams/protocol-<name>.mmd
                continue
            # the package affidavit.adapters (…) is the checkout's adapters/ (pyproject.toml)
            tries = (m[1], f"affidavit/{m[1]}", m[1].removeprefix("affidavit/"))
            if not any((ROOT / p).exists() for p in tries):
                bad.append(f"{where}: {m[1]}")
        for m in re.finditer(r"\b(test_\w+)(…)?", text):
            where = f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            if not (m[1] in defined or (m[2] and any(d.startswith(m[1]) for d in defined))):
                bad.append(f"{where}: {m[0]}")
    assert bad == []


def test_every_setting_a_doc_names_exists() -> None:
    """Prose names settings as ``[service] lease_margin``, ``service.lease_margin`` or
    ``targets.NAME.proxy`` (the field paths errors print): each is a key its table's schema
    reads, so a renamed setting cannot live on in a doc that tells an operator to set it."""
    from affidavit.config.loader import JOURNAL, VAULT
    from affidavit.config.service import SERVICE
    from affidavit.protocols.http import HTTP_TARGET
    from affidavit.protocols.ssh import SSH_TARGET

    tables = {"journal": JOURNAL.allowed, "vault": VAULT.allowed, "service": SERVICE.allowed}
    target_keys = set(HTTP_TARGET.allowed) | set(SSH_TARGET.allowed)
    named = re.compile(
        r"\[(journal|service|vault)\] `?([a-z_]+)"
        r"|(?<![\w./])(journal|service|vault)\.([a-z_]+)\b(?![./])"
        r"|\btargets\.(?:NAME|<name>|[a-z_]+)\.([a-z_]+)"
    )
    bad, seen = [], 0
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in named.finditer(text):
            where = f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            table, key = (m[1], m[2]) if m[1] else (m[3], m[4]) if m[3] else ("targets", m[5])
            if key in ("md", "py", "db", "key", "pub", "toml", "vault", "sock", "postgres"):
                continue  # a file: journal.md, affidavit.vault
            keys = target_keys if table == "targets" else tables[table]
            seen += 1
            if key not in keys:
                bad.append(f"{where}: {m[0]!r}: {table} has no {key!r}")
    assert bad == []
    assert seen > 30, seen


def test_the_documented_config_error_line_is_what_the_command_line_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/configuration.md shows one config error as the command line prints it
    (``affidavit: CONFIG_INVALID: <file>: targets.billing.inject: must be ...``): a target with
    an inject scheme none of those prints exactly that line, with its own file, and exits 2."""
    from affidavit.cli import main as cli_main

    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    shown = re.search(
        r"^affidavit: CONFIG_INVALID: (\S+): (targets\.billing\.inject: .+)$", text, re.M
    )
    assert shown is not None
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(
        '[targets.billing]\nkind = "http"\nurl = "https://api.example.com"\nmethods = ["GET"]\n'
        'credential = "env:TOKEN"\ninject = "token"\n'
    )
    assert cli_main(["actions", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"affidavit: CONFIG_INVALID: {cfg}: {shown[2]}", (err, shown[0])


def test_every_documented_mcp_server_entry_runs_an_affidavit_command_that_exists() -> None:
    """An ``mcpServers`` entry (docs/mcp.md, README.md) is pasted into an MCP client as is:
    its ``command`` is ``affidavit`` and its ``args`` are a command line the parser takes."""
    import json

    entries = []
    for where, body in _blocks("json"):
        if '"mcpServers"' in body:
            entries += [(where, e) for e in json.loads(body)["mcpServers"].values()]
    assert len(entries) >= 3, entries
    bad = []
    for where, entry in entries:
        if entry["command"] != "affidavit" or _refusal(entry["args"]) is not None:
            bad.append(f"{where}: {entry}: {_refusal(entry['args'])}")
    assert bad == []


async def _signed_rows(db: Path, iid: str) -> None:
    from affidavit.journal import Journal
    from tests.journal.helpers import happy

    async with Journal.open(db) as j:
        for ev in happy(iid):
            await j.append(ev)


@pytest.mark.parametrize("doc", ["deployment.md", "journal.md"])
def test_the_cron_anchor_recipe_runs_from_its_first_run_on(doc: str, tmp_path: Path) -> None:
    """The anchor recipe from cron, run by bash as written (its paths made this test's): the
    first run has no previous anchor, so it passes no ``--previous`` (it passed ``--previous
    ''``, which the CLI happens to take as none), and the second continues from the first."""
    import os
    import shutil
    import subprocess
    import sys

    import trio

    [recipe] = [
        b for where, b in _blocks("sh") if where.startswith(f"docs/{doc}:") and "$last" in b
    ]
    assert "${last:+" in recipe
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    base = [sys.executable, "-m", "affidavit"]
    done = subprocess.run([*base, "init"], cwd=tmp_path, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    anchors = tmp_path / "anchors"
    anchors.mkdir()
    config = tmp_path / "affidavit.toml"
    run = subprocess.run(
        [*base, "journal", "public-key", "--config", str(config), "--out", str(anchors / "p")],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    script = (
        recipe.replace("/srv/anchors/journal.pub", str(anchors / "p"))
        .replace("/srv/anchors", str(anchors))
        .replace("/etc/affidavit/affidavit.toml", str(config))
    )
    # The argv each run passes, one line each (empty words kept visible as '').
    shim = (
        f"affidavit() {{ printf '%q ' \"$@\" >> {shlex.quote(str(tmp_path / 'argv'))}; "
        f'echo >> {shlex.quote(str(tmp_path / "argv"))}; {shlex.join(base)} "$@"; }}\n'
    )
    bash = shutil.which("bash")
    assert bash is not None
    for n in (1, 2):
        trio.run(_signed_rows, tmp_path / "affidavit.db", f"inv-{n}")
        if n == 2:  # (the recipe names its anchor by the second)
            first = next(anchors.glob("anchor-*.json")).name
            for _ in range(30):  # at most 1.5 s
                if first != f"anchor-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json":
                    break
                time.sleep(0.05)
        done = subprocess.run(
            [bash, "-e", "-c", shim + script],
            cwd=tmp_path,
            env={**env, "AFFIDAVIT_CONFIG": str(config)},
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, (n, done.stdout, done.stderr)
        assert len(list(anchors.glob("anchor-*.json"))) == n
    lines = (tmp_path / "argv").read_text().splitlines()
    first_run, second_run = [x for x in lines if x.startswith("journal anchor ")]
    assert "--previous" not in first_run, first_run  # not --previous '': no anchor before
    assert f"--previous {anchors}/anchor-" in second_run, second_run
