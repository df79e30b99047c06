"""An SSH attempt cut short after its output echoed the credential keeps no hash of that output.

``delivery.received_evidence`` withholds ``<stream>_sha256`` of a complete result whose stream
redaction changed: the hash of bytes holding a secret lets whoever reads the record test a
guess of it offline (docs/redaction.md, "What was received").  An attempt that ends without a
result records the driver's facts in ATTEMPT_INTERRUPTED (``ssh.driver.result_facts``: each
stream's count and SHA-256 of the bytes received, before redaction) -- the caller reads them in
the record view; the echoed stream's hash must go there too, not only its count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.statemachine import EventKind
from affidavit.views.records import record_view
from tests.broker.helpers import assert_error, open_broker, write_config

from .brokerkit import ssh_target
from .sshd import Sshd

LIMIT = 64 << 10


pytestmark = pytest.mark.usefixtures("key_env")


def _keys(value: Any) -> set[str]:
    """The keys holding a value (a withheld count is null: ``engine/echoed.py``)."""
    if isinstance(value, dict):
        return {k for k, v in value.items() if v is not None} | {
            k for v in value.values() for k in _keys(v)
        }
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


async def test_an_echo_in_an_interrupted_ssh_answer_is_not_hashed_for_the_caller(
    tmp_path: Path, sshd: Sshd
) -> None:
    target = ssh_target(sshd.port, sshd.user, sshd.host_pin, max_result=LIMIT)
    cfg = write_config(tmp_path, {"box": target})
    # The key echoed first, then more than max_result: the attempt ends RESULT_SIZE_LIMIT.
    command = f"cat {sshd.client_key_path}; head -c {4 * LIMIT} /dev/zero"
    with trio.fail_after(20):
        async with open_broker(cfg) as b:
            env = await b.call({"target": "box", "command": command})
            assert_error(b, env, phase="remote_execution", outcome="unknown", retry="reconcile",
                         code="RESULT_SIZE_LIMIT")  # fmt: skip
            rec = b.record(env["invocation_id"])
            assert rec is not None
            view = record_view(rec, b.events(env["invocation_id"]))
    [ended] = [e for e in view["events"] if e["kind"] == EventKind.ATTEMPT_INTERRUPTED.value]
    facts = ended["attrs"]["facts"]
    assert facts["received_withheld"] == "redacted"  # sanity: the echo was seen, and redacted
    assert facts["stdout_bytes"] is None and "stdout_sha256" not in _keys(facts)
    # Nowhere a caller reads: the event, the record's protocol evidence, the envelope.
    for shown in (ended["attrs"], view["record"]["evidence"], env["evidence"]):
        assert "stdout_sha256" not in _keys(shown), shown
        # Nor the bytes received when max_result stopped it: the key's length is in them.
        assert not {"received_bytes", "decoded_bytes"} & _keys(shown), shown
    over = {"limit": LIMIT, "received_withheld": "redacted"}
    assert ended["attrs"]["result_size_limit"] == env["evidence"]["result_size_limit"] == over
    assert env["evidence"]["ssh"]["result_size_limit"] == over
    for message in (ended["attrs"]["message"], env["error"]["message"]):
        assert "bytes received are not told" in message, message
