"""SSH's stdout and stderr follow the streams' one rule for an end (audit 54b, F1): a stream that
ended complete (the channel's EOF) keeps its end whatever it is, and one cut short withholds
its last bytes whatever they are (``Redactor.flush``, docs/redaction.md "Partial answers").  A
command that prints a guess of the key's beginning gets the same answer and record whether the
guess is right or wrong: no ``[REDACTED]`` tells it which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.secrets.redaction import REDACTED
from affidavit.statemachine import EventKind
from tests.broker.helpers import open_broker, write_config

from .brokerkit import ssh_target
from .sshd import Sshd, SshKeys

pytestmark = pytest.mark.usefixtures("key_env")


def _guesses(keys: SshKeys) -> tuple[str, str]:
    """The beginning of a line of the key's body (its random part), and the same with its
    last character wrong."""
    line = keys.client_key.splitlines()[3].decode()
    right = line[:20]
    wrong = right[:-1] + ("A" if right[-1] != "A" else "B")
    return right, wrong


async def _run(tmp: Path, sshd: Sshd, command: str, **target: Any) -> tuple[Any, dict[str, Any]]:
    tmp.mkdir()
    cfg = write_config(tmp, {"box": ssh_target(sshd.port, sshd.user, sshd.host_pin, **target)})
    async with open_broker(cfg) as b:
        with trio.fail_after(20):
            env = await b.call({"target": "box", "command": command})
        ended = [e.attrs for e in b.events(env["invocation_id"])
                 if e.kind is EventKind.ATTEMPT_INTERRUPTED]  # fmt: skip
    return env, (ended[0] if ended else {})


async def test_output_ending_with_a_guess_is_shown_alike_right_or_wrong(
    tmp_path: Path, sshd: Sshd, ssh_keys: SshKeys
) -> None:
    shown = []
    for i, guess in enumerate(_guesses(ssh_keys)):
        command = f"printf 'no such file: %s' '{guess}'; printf 'error: %s' '{guess}' >&2"
        env, _ = await _run(tmp_path / str(i), sshd, command)
        result = env["result"]
        assert result["stdout"] == f"no such file: {guess}", env
        assert result["stderr"] == f"error: {guess}", env
        assert env["evidence"]["ssh"]["received_withheld"] is None, env
        assert REDACTED.decode() not in json.dumps(env)
        # Alike but for the guess (and the hash of what differs: the guess).
        kept = {k: v for k, v in result.items() if "sha256" not in k}
        shown.append(json.dumps(kept).replace(guess, "GUESS"))
    assert shown[0] == shown[1]


async def test_output_cut_short_after_a_guess_is_recorded_alike_right_or_wrong(
    tmp_path: Path, sshd: Sshd, ssh_keys: SshKeys
) -> None:
    """A command stalled after printing its guess: cut at the total timeout, both streams'
    ends withheld (``tail_redacted``), their counts and hashes too, right guess or wrong."""
    told = []
    for i, guess in enumerate(_guesses(ssh_keys)):
        command = f"printf '%s' '{guess}'; printf '%s' '{guess}' >&2; sleep 30"
        timeout = {"connect": 1, "total": 2}
        env, ended = await _run(tmp_path / str(i), sshd, command, timeout=timeout)
        assert "result" not in env and env["error"]["outcome"] == "unknown", env
        assert env["evidence"]["ssh"]["received_withheld"] == "tail_redacted", env
        facts = ended["facts"]
        assert facts["received_withheld"] == "tail_redacted", facts
        for stream in ("stdout", "stderr"):
            assert facts[f"{stream}_bytes"] is None and facts.get(f"{stream}_sha256") is None
        told.append((env["error"]["code"], sorted(k for k, v in facts.items() if v is None)))
    assert told[0] == told[1]
