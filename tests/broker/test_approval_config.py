"""The ``approval`` and ``reconcile`` settings and ``[service]``'s operators: what loads, and
the field path every mistake is reported at (docs/approvals.md)."""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from pathlib import Path

import pytest

from affidavit.config import ConfigError, load_config, sample_config
from affidavit.engine.approval import needs_approval
from affidavit.protocols.actions import parse_action
from affidavit.protocols.http import HttpTarget
from affidavit.protocols.http import action as httpaction
from affidavit.protocols.ssh import SshTarget
from affidavit.protocols.ssh import action as sshaction
from affidavit.schema import approval
from affidavit.schema.approval import RUNNERS, runner
from affidavit.statemachine import Outcome

from .helpers import run_cli
from .test_config import KEY_A

OPERATORS = "[service]\noperator_uids = [1001]\n"


def _config(tmp_path: Path, http: str = "", ssh: str = "", service: str = OPERATORS) -> Path:
    text = f"""
{service}
[targets.billing]
kind = "http"
url = "https://billing.example.com"
methods = ["GET", "POST"]
credential = "env:T"
{http}

[targets.deploy]
kind = "ssh"
host = "127.0.0.1"
user = "deploy"
host_key = "{KEY_A}"
credential = "env:K"
{ssh}
"""
    path = tmp_path / "affidavit.toml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, **kw: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(_config(tmp_path, **kw))
    return info.value


def test_approval_always_and_by_method_or_command(tmp_path: Path) -> None:
    config = load_config(
        _config(
            tmp_path,
            http='approval = "always"',
            ssh='approval = { commands = ["^deploy ", "rm "], ttl = "1h", wait = "30s" }',
        )
    )
    billing, deploy = config.targets["billing"], config.targets["deploy"]
    assert isinstance(billing, HttpTarget) and isinstance(deploy, SshTarget)
    assert billing.approval is not None and deploy.approval is not None
    assert billing.approval.always and (billing.approval.ttl, billing.approval.wait) == (900, 0)
    assert billing.approval.requires(method="GET")
    assert (deploy.approval.ttl, deploy.approval.wait) == (3600, 30)
    assert deploy.approval.requires(command="deploy --release r42")
    assert deploy.approval.requires(command="sudo rm -rf /srv/x")
    assert not deploy.approval.requires(command="uptime")
    by_method = load_config(_config(tmp_path, http='approval = { methods = ["post"] }'))
    policy = by_method.targets["billing"].approval  # type: ignore[attr-defined]
    assert policy.methods == {"POST"}
    assert policy.requires(method="POST") and not policy.requires(method="GET")
    assert config.service.operator_uids == (1001,) and not config.service.allow_self_approval


@pytest.mark.parametrize(
    ("setting", "method", "why"),
    [
        ('approval = "always"', "GET", "every action of this target needs approval"),
        ('approval = { methods = ["POST"] }', "POST", "its method POST is listed in methods"),
        ('approval = { methods = ["POST"] }', "GET", None),
    ],
)
def test_an_http_approval_says_why_it_was_asked(
    tmp_path: Path, setting: str, method: str, why: str | None
) -> None:
    """As an SSH approval does (``approval_reason``): the operator sees which rule asked."""
    config = load_config(_config(tmp_path, http=setting))
    target = config.targets["billing"]
    action = parse_action({"target": "billing", "method": method, "path": "/v1/x"}, config)
    assert (needs_approval(action, target) is not None) == (why is not None)
    assert httpaction.operator_view(action, target).get("approval_reason") == why


# Seed, "Validation and credential injection finish before dispatch": a denied approval stops
# the call with nothing sent -- which protects only if the guarded command cannot slip past the
# policy.  A regex over a shell line cannot see through quoting, separators, expansion or a
# shell reading stdin, so a ``commands`` list vouches only for a simple command without stdin
# whose first word does not run other code; everything else waits for a yes, with the reason
# shown to the operator (docs/approvals.md).
DOCUMENTED = 'approval = { commands = ["^deploy ", "rm "], ttl = "1h", wait = "30s" }'


def _deploy_needs(tmp_path: Path, command: str, stdin: str | None = None) -> tuple[bool, str]:
    config = load_config(_config(tmp_path, ssh=DOCUMENTED))
    obj = {"target": "deploy", "command": command}
    if stdin is not None:
        obj["stdin"] = stdin
    action = parse_action(obj, config)
    target = config.targets["deploy"]
    view = sshaction.operator_view(action, target)
    return needs_approval(action, target) is not None, str(view.get("approval_reason"))


@pytest.mark.parametrize(
    ("command", "stdin", "why"),
    [
        ("true;deploy prod", None, "not a simple command (it holds ';')"),
        ("deploy\tprod", None, "not a simple command (it holds '\\t')"),
        ("rm\t-rf /srv", None, "not a simple command (it holds '\\t')"),
        ("sh -s", "deploy prod", "it has stdin, which no pattern sees"),
        ("uptime", "", "it has stdin, which no pattern sees"),
        ("deploy$IFS prod", None, "not a simple command (it holds '$')"),
        ("echo $(deploy prod)", None, "not a simple command (it holds '$')"),
        ("true && deploy prod", None, "not a simple command (it holds '&')"),
        ("'deploy' prod", None, 'not a simple command (it holds "\'")'),
        ("deploy\u00a0prod", None, "not a simple command (it holds '\\xa0')"),
        (" deploy prod", None, "not a simple command (a leading, trailing or double space)"),
        ("deploy  prod", None, "not a simple command (a leading, trailing or double space)"),
        ("X=1 deploy prod", None, "not a simple command (it starts with a variable assignment)"),
        ("sudo deploy prod", None, "'sudo' runs other commands or code"),
        ("env deploy prod", None, "'env' runs other commands or code"),
        ("/bin/sh /tmp/x", None, "'sh' runs other commands or code"),
        ("python3 /tmp/x.py", None, "'python3' runs other commands or code"),
        ("deploy prod", None, "it matches commands[0] (^deploy )"),
        ("/opt/bin/deploy prod", None, "it matches commands[0] (^deploy )"),
        # Found against a real sshd (audit 49): each ran /opt/bin/deploy prod with no yes.
        ("setarch x86_64 /opt/bin/deploy prod", None, "'setarch' runs other commands or code"),
        ("prlimit /opt/bin/deploy prod", None, "'prlimit' runs other commands or code"),
        ("unshare /opt/bin/deploy prod", None, "'unshare' runs other commands or code"),
        ("setpriv /opt/bin/deploy prod", None, "'setpriv' runs other commands or code"),
        ("chrt -o 0 /opt/bin/deploy prod", None, "'chrt' runs other commands or code"),
        ("jobs -x /opt/bin/deploy prod", None, "'jobs' runs other commands or code"),
        ("coproc deploy prod", None, "'coproc' runs other commands or code"),
        ("trap deploy EXIT", None, "'trap' runs other commands or code"),
        ("perl5.36.0 -e system+q,deploy,", None, "'perl5.36.0' runs other commands or code"),
        ("Perl -e system+q,deploy,", None, "'Perl' runs other commands or code"),
        ("/usr/bin/SUDO deploy prod", None, "'SUDO' runs other commands or code"),
        ("ssh-agent /opt/bin/deploy prod", None, "'ssh-agent' runs other commands or code"),
        ("vim.tiny -S /tmp/x", None, "'vim.tiny' runs other commands or code"),
        (
            "/lib64/ld-linux-x86-64.so.2 /x",
            None,
            "'ld-linux-x86-64.so.2' runs other commands or code",
        ),
        ("git -c core.pager=deploy log", None, "'git' runs other commands or code"),
        ("tar -xf a.tar --to-command=deploy", None, "'tar' runs other commands or code"),
        ("./deploy prod", None, "it matches commands[0] (^deploy )"),
        ("rm -rf /srv", None, "it matches commands[1] (rm )"),
    ],
)
def test_a_command_pattern_list_vouches_only_for_simple_commands_without_stdin(
    tmp_path: Path, command: str, stdin: str | None, why: str
) -> None:
    assert _deploy_needs(tmp_path, command, stdin) == (True, why)


@pytest.mark.parametrize(
    "command", ["uptime", "ls -la /srv/releases", "systemctl status app.service", "echo a=b,c@d"]
)
def test_a_simple_command_no_pattern_matches_runs_without_approval(
    tmp_path: Path, command: str
) -> None:
    assert _deploy_needs(tmp_path, command) == (False, "None")


@pytest.mark.parametrize(
    ("word", "name"),
    [
        ("perl5.36.0", "perl"),
        ("python3.11", "python"),
        ("pypy3", "pypy"),
        ("ruby3.1", "ruby"),
        ("lua5.4", "lua"),
        ("tclsh8.6", "tclsh"),
        ("php8.2", "php"),
        ("node18", "node"),
        ("gawk-5.1.0", "gawk"),
        ("perl5.36-x86_64-linux-gnu", "perl"),  # Debian's multiarch name
        ("python3.11-aarch64-linux-gnu", "python"),
        ("ruby-arm-linux-gnueabihf", "ruby"),
        ("vim.basic", "vim"),  # Debian's alternatives
        ("vim.tiny", "vim"),
        ("/bin/sh.distrib", "sh"),
        ("/lib64/ld-linux-x86-64.so.2", "ld.so"),  # the loader, by any name
        ("ld-linux-aarch64.so.1", "ld.so"),
        ("ld-2.31.so", "ld.so"),
        ("ld64.so.2", "ld.so"),
        ("ld64.so.1", "ld.so"),
        ("ld-linux-x32.so.2", "ld.so"),
        ("ld-musl-x86_64.so.1", "ld.so"),
        ("ld.so", "ld.so"),
        ("rbash", "rbash"),
        ("ssh-agent", "ssh-agent"),
        ("start-stop-daemon", "start-stop-daemon"),
        ("systemd-cat", "systemd-cat"),
        ("systemd-inhibit", "systemd-inhibit"),
        ("systemd-socket-activate", "systemd-socket-activate"),
        ("x86_64", "x86_64"),
        ("linux32", "linux32"),
        ("/USR/BIN/Env", "env"),
        ("deploy", None),
        ("deploy2", None),
        ("uptime", None),
        ("systemctl", None),
        ("less", None),
        ("unzip", None),
        ("ld", None),  # the linker, not the loader
        ("ldconfig", None),
        ("x86_64-linux-gnu-gcc", None),  # a multiarch prefix is the name
        ("deploy.basic", None),
    ],
)
def test_a_runner_is_known_by_any_case_directory_debian_suffix_version_or_loader_name(
    word: str, name: str | None
) -> None:
    assert runner(word) == name


def test_the_runners_are_kept_sorted_in_commented_groups() -> None:
    """One place, each group under the comment that says how its names run another program."""
    source = inspect.getsource(approval)
    body = source[
        source.index("RUNNERS = frozenset(") : source.index("\n)\n", source.index("RUNNERS"))
    ]
    groups = re.split(r"\n\s*#[^\n]*(?:\n\s*#[^\n]*)*", body)[1:]
    assert len(groups) >= 5
    names = [re.findall(r'"([^"]+)"', g) for g in groups]
    assert all(n == sorted(n) and n for n in names)
    assert sum(len(n) for n in names) == len(RUNNERS)


def test_a_commands_list_logs_that_it_is_no_boundary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/approvals.md: no list of what waits is complete against a hostile caller; loading a
    config that uses one says so once for the target, an allow-list or "always" never."""
    for setting, logged in [(DOCUMENTED, 1), (ALLOW_LIST, 0), ('approval = "always"', 0)]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="affidavit.config"):
            load_config(_config(tmp_path, ssh=setting))
        records = [r for r in caplog.records if r.name == "affidavit.config"]
        assert len(records) == logged, setting
        for r in records:
            assert r.levelno == logging.WARNING
            assert r.getMessage().startswith("targets.deploy.approval.commands: ")
            assert "except_commands" in r.getMessage()


def test_a_config_loaded_twice_in_one_process_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review of sshfix49, #3: ``actions``, ``metrics`` and ``journal verify`` load the config
    twice; each (config path, content) is reported once per process -- again once its content
    changed."""
    path = _config(tmp_path, ssh=DOCUMENTED)
    with caplog.at_level(logging.WARNING, logger="affidavit.config"):
        load_config(path)
        load_config(str(path))
        assert len([r for r in caplog.records if r.name == "affidavit.config"]) == 1
        path.write_text(path.read_text() + "# edited\n")
        load_config(path)
        load_config(path)
    assert len([r for r in caplog.records if r.name == "affidavit.config"]) == 2


def test_the_cli_shows_a_commands_caveat_once_with_its_warning_prefix(tmp_path: Path) -> None:
    """A command that reads the config (``journal verify`` loads it twice) shows the caveat as
    the CLI's other warnings, ``affidavit: warning: ...`` once on stderr -- not as a bare line
    from Python's fallback handler."""
    done = run_cli("journal", "verify", "--config", str(_config(tmp_path, ssh=DOCUMENTED)))
    err = done.stderr.decode().splitlines()
    lines = [line for line in err if "approval.commands" in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(
        "affidavit: warning: targets.deploy.approval.commands: commands lists what waits"
    ), lines[0]
    assert "Traceback" not in done.stderr.decode()


ALLOW_LIST = 'approval = { except_commands = ["uptime", "systemctl status [a-z.-]+"] }'


@pytest.mark.parametrize(
    ("command", "stdin", "why"),
    [
        ("uptime", None, None),
        ("systemctl status app.service", None, None),
        ("systemctl status app.service --no-pager", None, "it is not listed in except_commands"),
        ("uptime --pretty", None, "it is not listed in except_commands"),
        ("deploy prod", None, "it is not listed in except_commands"),
        ("uptime;deploy prod", None, "not a simple command (it holds ';')"),
        ("uptime", "", "it has stdin, which no pattern sees"),
    ],
)
def test_except_commands_lets_only_the_listed_simple_commands_skip_approval(
    tmp_path: Path, command: str, stdin: str | None, why: str | None
) -> None:
    """The inverse, robust form: every command waits but the simple ones (without stdin) that
    a pattern matches whole."""
    config = load_config(_config(tmp_path, ssh=ALLOW_LIST))
    target = config.targets["deploy"]
    policy = target.approval  # type: ignore[attr-defined]
    assert policy is not None and not policy.always
    assert policy.except_commands == ("uptime", "systemctl status [a-z.-]+")
    obj = {"target": "deploy", "command": command}
    if stdin is not None:
        obj["stdin"] = stdin
    action = parse_action(obj, config)
    assert (needs_approval(action, target) is not None) == (why is not None)
    assert sshaction.operator_view(action, target).get("approval_reason") == why


@pytest.mark.parametrize(
    ("kw", "field", "message"),
    [
        ({"http": 'approval = "sometimes"'}, "targets.billing.approval", '"always" or a table'),
        (
            {"http": 'approval = { commands = ["x"] }'},
            "targets.billing.approval.commands",
            "unknown",
        ),
        (
            {"ssh": 'approval = { methods = ["POST"] }'},
            "targets.deploy.approval.methods",
            "unknown",
        ),
        (
            {"ssh": 'approval = { commands = ["("] }'},
            "targets.deploy.approval.commands[0]",
            "regular",
        ),
        ({"http": "approval = { methods = [] }"}, "targets.billing.approval.methods", "at least"),
        (
            {"ssh": 'approval = { commands = ["' + "(" * 2000 + '"] }'},
            "targets.deploy.approval.commands[0]",
            "longer than",
        ),
        (
            {"http": 'approval = { ttl = "1m", wait = "2m" }'},
            "targets.billing.approval.wait",
            "must not exceed ttl",
        ),
        ({"http": 'approval = { ttl = "30d" }'}, "targets.billing.approval.ttl", "7 days"),
        ({"http": 'approval = { wait = "-1s" }'}, "targets.billing.approval.wait", "duration"),
        (
            {"http": 'approval = "always"', "service": ""},
            "targets.billing.approval",
            "nobody may approve",
        ),
        (
            {"service": "[service]\nallow_self_approval = 1\n"},
            "service.allow_self_approval",
            "true or false",
        ),
        ({"service": "[service]\noperator_uids = [-1]\n"}, "service.operator_uids[0]", "id"),
        (
            {"ssh": 'approval = { commands = ["^rm "], except_commands = ["uptime"] }'},
            "targets.deploy.approval.except_commands",
            "cannot be given with commands",
        ),
        (
            {"ssh": "approval = { except_commands = [] }"},
            "targets.deploy.approval.except_commands",
            "at least one pattern",
        ),
        (
            {"http": 'approval = { except_commands = ["x"] }'},
            "targets.billing.approval.except_commands",
            "",
        ),
    ],
)
def test_an_approval_mistake_names_its_field(
    tmp_path: Path, kw: dict[str, str], field: str, message: str
) -> None:
    err = _error(tmp_path, **kw)
    assert err.field == field
    assert message in err.message


def test_reconcile_queries_load_for_http_and_ssh(tmp_path: Path) -> None:
    config = load_config(
        _config(
            tmp_path,
            http='reconcile = { path = "/v1/charges?idempotency_key={idempotency_key}", '
            'committed_if = ["status:200", "json:/key={idempotency_key}", '
            '"json:/status=succeeded"], '
            'rejected_if = ["status:404", "json:/error/key={idempotency_key}"] }',
            ssh='reconcile = { command = "test -e /srv/releases/{idempotency_key}", '
            'committed_if = "exit:0", rejected_if = "exit:1", settle = "5m" }',
        )
    )
    billing, deploy = config.targets["billing"], config.targets["deploy"]
    assert isinstance(billing, HttpTarget) and isinstance(deploy, SshTarget)
    assert billing.reconcile is not None and deploy.reconcile is not None
    assert billing.reconcile.method == "GET"
    assert (billing.reconcile.settle, deploy.reconcile.settle) == (60.0, 300.0)
    action = {"target": "billing", "method": "GET", "path": "/v1/charges?idempotency_key=a%2Fb"}
    from affidavit.protocols.http import reconcile as http_reconcile
    from affidavit.protocols.ssh import reconcile as ssh_reconcile

    assert http_reconcile.query(billing, {"idempotency_key": "a/b"}) == action
    assert ssh_reconcile.query(deploy, {"idempotency_key": "r42.1"}) == {
        "target": "deploy",
        "command": "test -e /srv/releases/r42.1",
    }
    # Shell syntax in a caller's value is refused, not quoted: the command may start a second
    # shell that would parse it unquoted (tests/ssh/test_reconcile_injection.py).
    with pytest.raises(ValueError, match=r"idempotency_key .* must be a plain word"):
        ssh_reconcile.query(deploy, {"idempotency_key": "r42;reboot"})
    ok, gone = {"status": 200, "headers": []}, {"status": 404, "headers": []}
    mine = {"idempotency_key": "a/b"}

    def answer(doc: object) -> dict[str, bytes]:
        return {"body": json.dumps(doc).encode()}

    body = answer({"key": "a/b", "status": "succeeded"})
    assert http_reconcile.verdict(billing, ok, body, mine) == (
        Outcome.COMMITTED,
        "status:200 and json:/key={idempotency_key} and json:/status=succeeded",
    )
    # The echo is compared exactly with the invocation's own value: another key's record, the
    # key as the URL carried it, or no key to compare with settle nothing.
    for other in ("SOMEONE-ELSES-KEY", "a%2Fb"):
        doc = answer({"key": other, "status": "succeeded"})
        assert http_reconcile.verdict(billing, ok, doc, mine) == (None, None)
    assert http_reconcile.verdict(billing, ok, body, {"idempotency_key": None}) == (
        None,
        "the invocation has no {idempotency_key} to compare the answer with",
    )
    pending = answer({"key": "a/b", "status": "pending"})
    assert http_reconcile.verdict(billing, ok, pending, mine) == (None, None)
    missing = answer({"error": {"key": "a/b"}})
    assert http_reconcile.verdict(billing, gone, missing, mine)[0] is Outcome.REJECTED
    assert http_reconcile.verdict(billing, gone, {}, mine) == (None, None)
    assert ssh_reconcile.verdict(deploy, {"exit_status": 1}, {}, mine)[0] is Outcome.REJECTED
    assert ssh_reconcile.verdict(deploy, {"exit_status": 2}, {}, mine) == (None, None)
    killed = {"exit_status": None, "exit_signal": "KILL"}
    assert ssh_reconcile.verdict(deploy, killed, {}, mine) == (
        None,
        None,
    )
    with pytest.raises(ValueError, match="no idempotency_key"):
        ssh_reconcile.query(deploy, {"invocation_id": "act_1"})


@pytest.mark.parametrize(
    ("kw", "field", "message"),
    [
        (
            {"http": 'reconcile = { path = "/v1/{amount}", committed_if = "status:200" }'},
            "targets.billing.reconcile.path",
            "unknown placeholder {amount}",
        ),
        (
            {"http": 'reconcile = { method = "DELETE", path = "/x", committed_if = "status:200" }'},
            "targets.billing.reconcile.method",
            "target's methods",
        ),
        (
            {"http": 'reconcile = { path = "/x" }'},
            "targets.billing.reconcile.rejected_if",
            "decide nothing",
        ),
        (
            {"http": 'reconcile = { path = "/x", committed_if = "status:2xx" }'},
            "targets.billing.reconcile.committed_if",
            "3-digit",
        ),
        (
            {"http": 'reconcile = { path = "/x", committed_if = ["status:200", "json:/a"] }'},
            "targets.billing.reconcile.committed_if[1]",
            "VALUE",
        ),
        (
            {"http": 'reconcile = { path = "x", committed_if = "status:200" }'},
            "targets.billing.reconcile.path",
            "single",
        ),
        (
            # A status alone is no proof of absence: a load balancer's or gateway's 404 meets it.
            {"http": 'reconcile = { path = "/x", rejected_if = "status:404" }'},
            "targets.billing.reconcile.rejected_if",
            "reads no json: condition",
        ),
        (
            # Nor a header: a load balancer's HTML 404 carries its server=nginx too.
            {
                "http": 'reconcile = { path = "/x", committed_if = "json:/a=b", '
                'rejected_if = ["status:404", "header:server=nginx"] }'
            },
            "targets.billing.reconcile.rejected_if",
            "add a json: condition",
        ),
        (
            {
                "http": 'reconcile = { path = "/x", committed_if = "json:/a=b", '
                'rejected_if = ["status:404", "status:410"] }'
            },
            "targets.billing.reconcile.rejected_if",
            "add a json: condition",
        ),
        (
            # A condition's VALUE takes the path's placeholders, and only those.
            {
                "http": 'reconcile = { path = "/x", '
                'committed_if = ["status:200", "json:/key={amount}"] }'
            },
            "targets.billing.reconcile.committed_if[1]",
            "unknown placeholder {amount}",
        ),
        (
            # A condition that could never match is refused, not loaded silently.
            {"http": 'reconcile = { path = "/x", committed_if = ["status:200", "json:/n=1.5"] }'},
            "targets.billing.reconcile.committed_if[1]",
            "no integer",
        ),
        (
            {"http": 'reconcile = { path = "/x", committed_if = ["status:200", "json:/n="] }'},
            "targets.billing.reconcile.committed_if[1]",
            "is empty",
        ),
        (
            {"http": 'reconcile = { path = "/x", committed_if = "header:X-Key={idempotency_key" }'},
            "targets.billing.reconcile.committed_if",
            "not a template",
        ),
        (
            {
                "ssh": "reconcile = { command = \"test -e '/srv/{idempotency_key}'\", "
                'committed_if = "exit:0" }'
            },
            "targets.deploy.reconcile.command",
            "inside ' quotes",
        ),
        (
            {"ssh": 'reconcile = { command = "echo ${session}", committed_if = "exit:0" }'},
            "targets.deploy.reconcile.command",
            "right after",
        ),
        (
            {"ssh": 'reconcile = { command = "ls $DIR{session}", committed_if = "exit:0" }'},
            "targets.deploy.reconcile.command",
            "right after a $NAME",
        ),
        (
            {"ssh": 'reconcile = { command = "ls {{a,{session}}}", committed_if = "exit:0" }'},
            "targets.deploy.reconcile.command",
            "between braces",
        ),
        (
            {
                "ssh": 'reconcile = { command = "true", committed_if = "exit:0", '
                'rejected_if = "exit:0" }'
            },
            "targets.deploy.reconcile.rejected_if",
            "differ",
        ),
        (
            {"ssh": 'reconcile = { command = "true", committed_if = "status:200" }'},
            "targets.deploy.reconcile.committed_if",
            "exit:N",
        ),
        (
            {"http": 'reconcile = { path = "/x", committed_if = "json:/a=b", settle = "-1s" }'},
            "targets.billing.reconcile.settle",
            "duration",
        ),
        (
            {"ssh": 'reconcile = { command = "true", rejected_if = "exit:1", settle = true }'},
            "targets.deploy.reconcile.settle",
            "duration",
        ),
    ],
)
def test_a_reconcile_mistake_names_its_field(
    tmp_path: Path, kw: dict[str, str], field: str, message: str
) -> None:
    err = _error(tmp_path, **kw)
    assert err.field == field
    assert message in err.message


@pytest.mark.parametrize(
    ("committed_if", "warned"),
    [
        ('"status:200"', True),
        ('["status:200", "header:content-type=text/html"]', True),
        ('["status:200", "json:/key={idempotency_key}"]', False),
    ],
    ids=["status-only", "status-and-header", "echo"],
)
def test_a_committed_if_reading_no_json_is_named_in_a_start_warning(
    tmp_path: Path, committed_if: str, warned: bool
) -> None:
    # A captive portal's or a login page's 200 would settle the invocation committed.
    from affidavit.protocols.http.binding import HttpBinding

    http = f'reconcile = {{ path = "/x", committed_if = {committed_if} }}'
    billing = load_config(_config(tmp_path, http=http)).targets["billing"]
    words = HttpBinding().start_warnings([billing])
    named = [w for w in words if "targets.billing.reconcile.committed_if" in w]
    assert len(named) == int(warned), words
    assert all("reads no json: condition" in w for w in named)


def test_the_samples_commented_approval_and_reconcile_examples_load(tmp_path: Path) -> None:
    """``affidavit init``'s sample shows both settings commented out; uncommented, they load."""
    lines = []
    for line in sample_config().splitlines():
        bare = line.lstrip()
        if bare.startswith(
            ("# approval", "# operator_uids", "# [service]", "# [targets.", "# path", "# command")
        ) or bare.startswith(("# committed_if", "# rejected_if")):
            line = bare[2:]
        lines.append(line)
    path = tmp_path / "affidavit.toml"
    path.write_text("\n".join(lines) + "\n")
    config = load_config(path)
    example, deploy = config.targets["example"], config.targets["deploy"]
    assert isinstance(example, HttpTarget) and isinstance(deploy, SshTarget)
    assert example.approval is not None and example.approval.methods == {"POST"}
    assert example.reconcile is not None and deploy.reconcile is not None
    assert deploy.approval is not None and config.service.has_operators


def test_a_local_uid_is_an_operator_by_its_uid_or_any_of_its_groups() -> None:
    """``OperatorPolicy.admits_uid`` (the console keeps places for operators by it): the uid
    named, or its primary or a supplementary group in the user database; an unknown uid is not
    one."""
    import grp
    import pwd

    from affidavit.approvals import OperatorPolicy

    me = pwd.getpwuid(os.getuid())
    mine = set(os.getgrouplist(me.pw_name, me.pw_gid))
    other_gid = max({g.gr_gid for g in grp.getgrall()} | mine) + 1  # a group no one is in
    assert OperatorPolicy(frozenset({os.getuid()}), frozenset()).admits_uid(os.getuid())
    assert OperatorPolicy(frozenset(), frozenset({me.pw_gid})).admits_uid(os.getuid())
    assert not OperatorPolicy(frozenset(), frozenset({other_gid})).admits_uid(os.getuid())
    assert not OperatorPolicy(frozenset(), frozenset()).admits_uid(os.getuid())
    unknown = 4_000_000_000
    with pytest.raises(KeyError):
        pwd.getpwuid(unknown)
    assert not OperatorPolicy(frozenset(), frozenset({me.pw_gid})).admits_uid(unknown)
    supplementary = sorted(mine - {me.pw_gid})
    if supplementary:  # a supplementary group counts as the primary one does
        assert OperatorPolicy(frozenset(), frozenset(supplementary[:1])).admits_uid(os.getuid())
