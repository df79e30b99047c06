"""Seed, "Validation and credential injection finish before dispatch": the credential version is
bound to the invocation; "if any bound value changes, create a new invocation; do not edit the
previous record".  A same-key retry after the credential was rotated must not act with the new
credential under the old invocation."""

from __future__ import annotations

from pathlib import Path

import trio

from affidavit.api.broker import Broker
from affidavit.cli.tour import DemoServer, demo_config
from affidavit.config import load_config

ACTION = {
    "target": "payments",
    "method": "POST",
    "path": "/payments",
    "body": "{}",
    "idempotency_key": "rotation-key-1",
}


async def test_same_key_retry_after_credential_rotation_is_config_changed(tmp_path: Path) -> None:
    token = tmp_path / "token.txt"
    token.write_text("first-token-value\n")
    token.chmod(0o600)  # a credential file is refused if others can read it
    cfg = tmp_path / "affidavit.toml"
    server = DemoServer()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        text = demo_config(tmp_path, port).replace(
            'credential = "env:AFFIDAVIT_DEMO_TOKEN"', f'credential = "file:{token}"'
        )
        cfg.write_text(text, encoding="utf-8")
        with trio.fail_after(20):
            async with Broker.open(config=load_config(cfg)) as broker:
                first = await broker.call(ACTION)
                assert first["error"]["retry"] == "same_idempotency_key"
                assert server.requests == 1

                token.write_text("rotated-token-value-longer\n")  # new version (size, mtime)
                second = await broker.call(ACTION)
                assert second["invocation_id"] == first["invocation_id"]
                err = second["error"]
                assert (err["code"], err["phase"]) == ("CONFIG_CHANGED", "validation")
                assert err["field"] == "targets.payments.credential"  # the setting to look at
                # The first attempt may have happened: still unknown, never not_attempted.
                assert (err["outcome"], err["retry"]) == ("unknown", "reconcile")
                assert second["evidence"]["dispatch_started"] is True
                assert server.requests == 1  # nothing was sent with the rotated credential

                # Restoring the bound credential makes the same-key retry possible again.
                token.write_text("first-token-value\n")
                record = broker.record(first["invocation_id"])
                assert record is not None and record.state == "retry_invalid"
        nursery.cancel_scope.cancel()
