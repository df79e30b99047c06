"""``ssh_exec`` through the real SDK client against a real OpenSSH sshd (tests/ssh): a command's
output and exit status arrive as structured content, a failing command is a committed
REMOTE_COMMAND_FAILED flagged isError, and no form of the private key crosses stdio or reaches
the server's log."""

from __future__ import annotations

from pathlib import Path

from tests.broker.helpers import http_target, write_config
from tests.ssh.brokerkit import KEY_ENV, leaked, ssh_target
from tests.ssh.sshd import Sshd

from .kit import connected, env_without_secrets, structured


async def test_ssh_exec_answers_with_the_command_s_result_and_never_the_key(
    tmp_path: Path, sshd: Sshd
) -> None:
    targets = {
        "box": ssh_target(sshd.port, sshd.user, sshd.host_pin),
        "api": http_target("http://127.0.0.1:9"),
    }
    cfg = write_config(tmp_path, targets)
    env = env_without_secrets(**{KEY_ENV: sshd.client_key.decode()})
    async with connected(["--config", str(cfg)], env, tmp_path / "mcp.log") as mcp:
        tools = {t.name: t for t in (await mcp.session.list_tools()).tools}
        assert {"ssh_exec", "http_request"} <= set(tools)
        assert tools["ssh_exec"].input_schema["properties"]["target"]["enum"] == ["box"]

        box = structured(await mcp.call("list_targets"))["targets"][1]
        assert (box["kind"], box["user"], box["port"]) == ("ssh", sshd.user, sshd.port)

        done = await mcp.call("ssh_exec", {"target": "box", "command": "cat", "stdin": "hi"})
        envelope = structured(done)
        assert done.is_error is False
        assert (envelope["result"]["exit_status"], envelope["result"]["stdout"]) == (0, "hi")

        failed = await mcp.call("ssh_exec", {"target": "box", "command": "exit 3"})
        error = structured(failed)["error"]
        assert failed.is_error is True
        assert (error["code"], error["outcome"]) == ("REMOTE_COMMAND_FAILED", "committed")

        # Each tool calls its own kind of target: refused before anything is invoked.
        wrong = await mcp.call("http_request", {"target": "box", "method": "GET", "path": "/"})
        assert wrong.is_error is True
        assert structured(wrong) == {
            "error": {
                "code": "UNSUPPORTED_ACTION",
                "phase": "validation",
                "outcome": "not_attempted",
                "retry": "after_correction",
                "message": "target box is of kind ssh: call it with ssh_exec",
                "field": "target",
            }
        }
        wire = "\n".join(mcp.wire).encode()
    assert leaked(wire, sshd.client_key) == []
    assert leaked((tmp_path / "mcp.log").read_bytes(), sshd.client_key) == []
