"""A caller's value in an SSH reconciliation query never runs as shell code -- not even when the
operator's template hands it to a second shell (``sh -c``), against the real sshd.

The idempotency key and the session are the caller's (a hostile agent).  Single-quoting them for
the shell that parses the template is not enough: ``sh -c "test -e /srv/"{idempotency_key}``
passes the unquoted key to ``sh -c``, which parses it again.  A value an SSH template takes must
be a plain word (``affidavit.protocols.placeholders.SHELL_WORD``): refused at acceptance when the
target's query names it, and refused by the query itself if it got into the journal otherwise
(a query configured after the call was accepted).
"""

from __future__ import annotations

import os
import shutil
import string
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.approvals import OperatorError
from affidavit.protocols.placeholders import parse_template, shell_escape
from tests.broker.helpers import open_broker, write_config

from .brokerkit import ssh_target
from .sshd import Sshd

LIMIT = 60


pytestmark = pytest.mark.usefixtures("key_env")


def _hostile_keys(pwned: Path) -> list[str]:
    # Keys are visible ASCII (no space): ${IFS} stands for the space a shell splits on.
    touch = f"touch${{IFS}}{pwned}"
    return [
        f"r1;{touch}",
        f"$({touch})",
        f"`{touch}`",
        f"x';{touch};'",
        f'x";{touch};"',
        f"r1|{touch}",
        f"r1&&{touch}",
    ]


def _target(sshd: Sshd, **kw: Any) -> dict[str, Any]:
    return ssh_target(sshd.port, sshd.user, sshd.host_pin, **kw)


def _nested(releases: Path) -> dict[str, Any]:
    # The template quotes its own part and leaves the placeholder outside: accepted at load.
    return {
        "command": f'sh -c "test -e {releases}/"{{idempotency_key}}',
        "committed_if": "exit:0",
        "rejected_if": "exit:1",
        "settle": "0s",
    }


async def test_a_key_for_a_nested_shell_is_refused_at_acceptance_and_never_runs(
    tmp_path: Path, sshd: Sshd
) -> None:
    releases, pwned = tmp_path / "releases", tmp_path / "pwned"
    releases.mkdir()
    target = _target(sshd, reconcile=_nested(releases))
    with trio.fail_after(LIMIT):
        async with open_broker(write_config(tmp_path, {"box": target})) as b:
            for key in _hostile_keys(pwned):
                action = {"target": "box", "command": "sleep 30", "idempotency_key": key}
                env = await b.call(action, timeout=3.0)
                if env["error"]["outcome"] == "unknown":  # accepted: what the query then runs
                    await b.reconcile(env["invocation_id"], query=True)
                assert not pwned.exists(), f"the key {key!r} ran as shell code"
                assert env["error"]["code"] == "INVALID_FIELD", (key, env["error"])
                assert env["error"]["field"] == "idempotency_key"
                assert env["error"]["outcome"] == "not_attempted"
            # A plain word still works through the nested shell.
            action = {"target": "box", "command": f"touch {releases}/r42.x && sleep 30"}
            env = await b.call({**action, "idempotency_key": "r42.x"}, timeout=3.0)
            assert env["error"]["outcome"] == "unknown", env["error"]
            answer = await b.reconcile(env["invocation_id"], query=True)
            assert answer["envelope"]["evidence"]["state"] == "reconciled_committed", answer
    assert not pwned.exists()


async def test_a_hostile_key_journaled_before_the_query_was_configured_is_never_run(
    tmp_path: Path, sshd: Sshd
) -> None:
    releases, pwned = tmp_path / "releases", tmp_path / "pwned"
    releases.mkdir()
    plain = write_config(tmp_path, {"box": _target(sshd)}, name="plain.toml")
    later = write_config(
        tmp_path, {"box": _target(sshd, reconcile=_nested(releases))}, name="q.toml"
    )
    ids = []
    with trio.fail_after(LIMIT):
        async with open_broker(plain) as b:  # no query names the key: any visible key is taken
            answers: dict[str, dict[str, Any]] = {}

            async def one(key: str) -> None:
                action = {"target": "box", "command": "sleep 30", "idempotency_key": key}
                answers[key] = await b.call(action, timeout=5.0)

            # At once (each waits out its timeout: one after the other, 7 x 3 s), with 2 s more
            # each for the seven handshakes sharing the CPU: every one dispatched, then unknown.
            async with trio.open_nursery() as calls:
                for key in _hostile_keys(pwned):
                    calls.start_soon(one, key)
            for key in _hostile_keys(pwned):
                env = answers[key]
                assert env["error"]["outcome"] == "unknown", env["error"]
                ids.append(env["invocation_id"])
        async with open_broker(later) as b:
            for iid in ids:
                refused: OperatorError | None = None
                try:
                    await b.reconcile(iid, query=True)
                except OperatorError as exc:
                    refused = exc
                assert not pwned.exists(), f"the key of {iid} ran as shell code"
                assert refused is not None and refused.code == "NO_QUERY"
                assert "idempotency_key" in refused.message
                assert "touch" not in refused.message  # the caller's value is not echoed
                assert b.record(iid).outcome.value == "unknown"  # type: ignore[union-attr]
    assert not pwned.exists()


@pytest.mark.parametrize(
    "value",
    [
        *("r1;reboot", "$(id)", "-rf", ".", "..", "a/b", "a b", "~root", "*", "é", ""),
        *("a,b", "r1,..", "a=b", "a:=ls", "a==ls"),
    ],
)
def test_a_shell_template_takes_only_plain_words(value: str) -> None:
    template = parse_template("test -e /srv/{idempotency_key}", shell=True)
    with pytest.raises(ValueError, match="plain word") if value else pytest.raises(ValueError):
        template.render({"idempotency_key": value}, shell_escape)
    for ok in ("r42", "release-7.1_b:x@y+z", "act_01HXYZ"):
        assert template.render({"idempotency_key": ok}, shell_escape) == f"test -e /srv/{ok}"


def test_the_plain_word_set_is_pinned_and_why_comma_and_equals_are_not_in_it() -> None:
    """Exactly ``A-Z a-z 0-9`` first, then also ``. _ : @ + -``.  ``,`` and ``=`` were in it, and
    a real shell reads each as syntax: bash expands ``,`` between braces (a template's literal
    ``{{ }}``) into more words; zsh replaces ``=cmd`` after ``=`` or ``:`` in an assignment with
    the command's path (a ``/`` the rule promises a value never holds)."""
    from affidavit.protocols.placeholders import SHELL_WORD

    allowed = {chr(c) for c in range(0x21, 0x7F) if SHELL_WORD.fullmatch("a" + chr(c))}
    first = {chr(c) for c in range(0x21, 0x7F) if SHELL_WORD.fullmatch(chr(c))}
    alnum = set(string.ascii_letters + string.digits)
    assert first == alnum and allowed == alnum | set("._:@+-")
    words = subprocess.run(
        ["bash", "-c", 'printf "<%s>" /srv/{old,a,b}'], capture_output=True, timeout=10
    )
    assert words.stdout == b"</srv/old></srv/a></srv/b>"  # a key a,b: three words, not two
    if shutil.which("zsh"):  # installed where the docs' zsh claim is checked
        assigned = subprocess.run(
            ["zsh", "-fc", 'R=a:=ls; printf "%s" "$R"'], capture_output=True, timeout=10
        )
        assert assigned.stdout.startswith(b"a:/") and assigned.stdout.endswith(b"/ls")


@pytest.mark.parametrize(
    ("template", "value", "bash_reads"),
    [
        ('printf "<%s>" {{{idempotency_key}}}', "1..3", b"<1><2><3>"),  # a sequence
        ('printf "<%s>" /srv/{{old,{idempotency_key}}}', "new", b"</srv/old></srv/new>"),
        ('bash -c "printf \\<%s\\> {{a,"{idempotency_key}"}}"', "1..2", b"<a><1..2>"),
        ('printf "<%s>" ${{{idempotency_key}}}', "SECRET", b"<leak>"),  # names a variable
        ('printf "<%s>" $SE{idempotency_key}', "CRET", b"<leak>"),  # extends a name
        ("printf \"<%s>\" {{a,'}}'{idempotency_key}}}", "b", b"<a><}b>"),
    ],
)
def test_a_template_where_a_plain_word_is_still_syntax_is_refused_at_load(
    template: str, value: str, bash_reads: bytes
) -> None:
    """Where the placeholder stands decides too: between braces (a shell's brace expansion,
    here or in one the template starts) or right after ``$NAME`` the value is read as syntax --
    shown with the real bash -- so such a template is refused when the config is loaded."""
    literal = template.replace("{{", "{").replace("}}", "}")
    rendered = literal.replace("{idempotency_key}", value)
    env = {"PATH": os.environ["PATH"], "SECRET": "leak"}
    ran = subprocess.run(["bash", "-c", rendered], capture_output=True, env=env, timeout=10)
    assert ran.stdout == bash_reads, (rendered, ran)
    with pytest.raises(ValueError, match=r"between braces|right after a \$NAME"):
        parse_template(template, shell=True)


@pytest.mark.parametrize(
    "template",
    [
        "test -e ${{DIR}}/{idempotency_key}",
        "awk '{{print}}' /srv/{idempotency_key}",
        "f() {{ test -e /srv/{idempotency_key}; }}; f",
        'bash -c "echo {{a,}}"{idempotency_key}',
        "find /srv -name x -exec rm {{}} \\; ; test -e /srv/{idempotency_key}",
    ],
)
def test_braces_and_parameters_closed_before_the_placeholder_are_taken(template: str) -> None:
    assert parse_template(template, shell=True).names == ("idempotency_key",)


async def test_a_key_with_comma_or_equals_is_refused_at_acceptance(
    tmp_path: Path, sshd: Sshd
) -> None:
    releases = tmp_path / "releases"
    releases.mkdir()
    target = _target(sshd, reconcile=_nested(releases))
    with trio.fail_after(LIMIT):
        async with open_broker(write_config(tmp_path, {"box": target})) as b:
            for key in ("r1,r2", "r1=x", "a:=ls"):
                env = await b.call({"target": "box", "command": "true", "idempotency_key": key})
                assert env["error"]["code"] == "INVALID_FIELD", (key, env["error"])
                assert env["error"]["field"] == "idempotency_key"
                assert env["error"]["outcome"] == "not_attempted"
                assert ". _ : @ + -)" in env["error"]["message"]


async def test_a_session_for_a_query_that_names_it_must_be_a_plain_word(
    tmp_path: Path, sshd: Sshd
) -> None:
    rc = {"command": "test -e /srv/{session}", "committed_if": "exit:0", "settle": "0s"}
    config = write_config(tmp_path, {"box": _target(sshd, reconcile=rc), "plain": _target(sshd)})
    with trio.fail_after(LIMIT):
        async with open_broker(config) as b:
            env = await b.call({"target": "box", "command": "true", "session": "agent 7;id"})
            assert (env["error"]["code"], env["error"]["field"]) == ("INVALID_FIELD", "session")
            # A target whose query does not name it takes any printable session.
            env = await b.call({"target": "plain", "command": "true", "session": "agent 7;id"})
            assert env["evidence"]["outcome"] == "committed", env
