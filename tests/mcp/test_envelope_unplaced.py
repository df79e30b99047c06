"""The embedded MCP server's envelope and ``get_record`` answer never name the journal's
directory or a key file's: a call whose credential file is missing (CREDENTIAL_FAILED) and a
call the remote drops mid-way (ATTEMPT_INTERRUPTED), the journal, its broker key files and the
credential's file in canary-named directories (as tests/daemon/test_envelope_unplaced.py
through the daemon)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.broker.helpers import http_target, write_config

from .conftest import Remotes
from .kit import connected, structured

JOURNAL_DIR = "canary-journal-dir-a53e"
KEY_DIR = "canary-key-dir-17c4"


async def test_no_embedded_envelope_or_record_names_the_journal_or_a_key_file(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    home, keys = tmp_path / JOURNAL_DIR, tmp_path / KEY_DIR
    home.mkdir()
    keys.mkdir()
    targets = {
        **remotes.targets(),
        "keyed": http_target(remotes.ok.url, credential=f"file:{keys / 'gone.token'}"),
    }
    journal = {
        "path": str(home / "journal.db"),
        "key_file": str(keys / "broker.key"),
        "signing_key": str(keys / "signing.key"),
    }
    cfg = write_config(home, targets, journal=journal)
    shown: list[str] = []
    log = tmp_path / "mcp.log"
    async with connected(["--config", str(cfg)], remotes.env(token), log) as mcp:
        for target, code in (("keyed", "CREDENTIAL_MISSING"), ("drops", "REMOTE_OUTCOME_UNKNOWN")):
            answer = await mcp.call(
                "http_request", {"target": target, "method": "POST", "path": "/"}
            )
            env = structured(answer)
            assert env["error"]["code"] == code, env
            record = await mcp.call("get_record", {"invocation_id": env["invocation_id"]})
            assert structured(record)["record"]["invocation_id"] == env["invocation_id"]
            for said in (answer, record):
                shown.append(json.dumps(structured(said)))
                shown += [getattr(c, "text", "") for c in said.content]
    for text in shown:
        for canary in (JOURNAL_DIR, KEY_DIR, "gone.token", str(tmp_path)):
            assert canary not in text, (canary, text)
