"""A ``vault:`` credential's version names its value, not just the entry's counter (rv45
finding 1).

Seed, "Validation and credential injection finish before dispatch": "Before approval, bind the
normalized target, the credential version, ... A mismatch yields validation/not_attempted and
does not permit sending a new request under the old approval"; and "if any bound value changes,
create a new invocation".  A vault deleted and made again (a lost passphrase, a compromise) or
restored from a backup is back at "version 1" with another value: that must not pass as the
version approved (or bound to an ``unknown`` invocation), and nothing goes out with it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.engine import credential as credential_step
from affidavit.secrets.credentials import Credential
from affidavit.secrets.vault import PASSPHRASE_ENV, Vault
from affidavit.statemachine import Code, Outcome, Retry
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config, verify_ok
from .helpers import http_target, open_broker, write_config

LIMIT = 20
TOKEN_A = b"VAULT-CANARY-approved-a1b2c3"
TOKEN_B = b"VAULT-CANARY-other-d4e5f6"
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


def _vault(path: Path, passphrase: str, value: bytes) -> None:
    """A new vault at ``path`` (any old one and its unlock file gone) with ``deploy = value``."""
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".unlock").unlink(missing_ok=True)
    vault = Vault.init(path, passphrase, n_log2=10)
    vault.unlock(passphrase)
    vault.put("deploy", value)


def _with_vault(cfg: Path, vault: Path) -> Path:
    with cfg.open("a", encoding="utf-8") as f:
        f.write(f"\n[vault]\npath = {json.dumps(str(vault))}\n")
    return cfg


def _assert_no_secret(where: str, data: bytes) -> None:
    """Neither token, nor its unkeyed hash (which a dictionary reverses for a short token)."""
    for token in (TOKEN_A, TOKEN_B):
        digest = hashlib.sha256(token).hexdigest().encode()
        assert token not in data and digest[:16] not in data, where


def _assert_clean(broker: Broker, tmp: Path, iid: str, *seen: Any) -> None:
    _assert_no_secret("envelope", json.dumps(seen).encode())
    _assert_no_secret("record", repr(broker.record(iid)).encode())
    _assert_no_secret("events", repr(broker.events(iid)).encode())
    for file in tmp.glob("journal.db*"):
        _assert_no_secret(file.name, file.read_bytes())


@pytest.fixture(autouse=True)
def _no_passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSPHRASE_ENV, raising=False)


async def test_an_approval_pending_while_the_vault_is_recreated_is_approval_stale(
    tmp_path: Path,
) -> None:
    vault = tmp_path / "v.vault"
    _vault(vault, "one", TOKEN_A)
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(
            tmp_path,
            srv.url,
            approval={"methods": ["POST"], "wait": "20s"},
            credential="vault:deploy",
        )
        async with open_broker(_with_vault(cfg, vault)) as b:
            got: dict[str, Any] = {}

            async def caller() -> None:
                got["env"] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(caller)
                    while not b.approvals():
                        await trio.sleep(0.02)
                    [waiting] = b.approvals()
                    assert waiting["version"].startswith("1:vault:hmac-sha256:")
                    _vault(vault, "two", TOKEN_B)  # also version 1, another value
                    await b.approve(waiting["invocation_id"], note="A is fine", operator=OPS)
            env = got["env"]
            assert env["error"]["code"] == "APPROVAL_STALE"
            assert (env["error"]["phase"], env["error"]["outcome"]) == (
                "validation",
                "not_attempted",
            )
            iid = env["invocation_id"]
            _assert_clean(b, tmp_path, iid, env, waiting, await b.fetch_result(iid))
            verify_ok(b)
    assert srv.requests == []


async def test_a_same_key_retry_after_the_vault_is_recreated_is_config_changed(
    tmp_path: Path,
) -> None:
    """The first try was dropped unanswered (``unknown``); its retry must not go out with the
    value a re-created vault holds under the same name and counter."""
    vault = tmp_path / "v.vault"
    _vault(vault, "one", TOKEN_A)
    key_contract = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    async with HostileServer.running(scripts.apply_then_close()) as srv:
        target = http_target(srv.url, credential="vault:deploy", idempotency=key_contract)
        cfg = write_config(tmp_path, {"api": target}, vault=str(vault))
        action = {**CHARGE, "idempotency_key": "vault-retry-1"}
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                first = await b.call(action)
                assert first["error"]["retry"] == "same_idempotency_key"
                _vault(vault, "two", TOKEN_B)
                second = await b.call(action)
            assert second["invocation_id"] == first["invocation_id"]
            err = second["error"]
            assert (err["code"], err["field"]) == ("CONFIG_CHANGED", "targets.api.credential")
            # It went out once, unanswered: still unknown, for a reconciliation to settle --
            # never "nothing sent" because the retry sent nothing.
            assert (err["outcome"], err["retry"]) == ("unknown", "reconcile")
            record = b.record(first["invocation_id"])
            assert record is not None
            assert (record.code, record.outcome, record.retry) == (
                Code.CONFIG_CHANGED,
                Outcome.UNKNOWN,
                Retry.RECONCILE,
            )
            _assert_clean(b, tmp_path, first["invocation_id"], first, second)
            verify_ok(b)
    assert [r.header("authorization") for r in srv.requests] == [f"Bearer {TOKEN_A.decode()}"]


async def test_a_retry_bound_to_a_bare_vault_counter_says_it_predates_value_digests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrade: a journal written before vault versions carried a value digest binds the bare
    counter ("1").  It never matches a version resolved now -- the safe side: the counter alone
    cannot tell which value went out -- and the message says why, not "changed"."""
    vault = tmp_path / "v.vault"
    _vault(vault, "one", TOKEN_A)
    key_contract = {"header": "Idempotency-Key", "scope": "charges", "retention": "24h"}
    resolve = credential_step.resolve

    def as_before(ref: str, **kw: Any) -> Credential:  # what the older release bound
        got = resolve(ref, **kw)
        return Credential(got.ref, got.value, got.version.split(":")[0])

    async with HostileServer.running(scripts.apply_then_close()) as srv:
        target = http_target(srv.url, credential="vault:deploy", idempotency=key_contract)
        cfg = write_config(tmp_path, {"api": target}, vault=str(vault))
        action = {**CHARGE, "idempotency_key": "vault-upgrade-1"}
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                with monkeypatch.context() as m:
                    m.setattr(credential_step, "resolve", as_before)
                    first = await b.call(action)
                assert first["error"]["retry"] == "same_idempotency_key"
                second = await b.call(action)
            err = second["error"]
            assert (err["code"], err["field"]) == ("CONFIG_CHANGED", "targets.api.credential")
            assert (err["outcome"], err["retry"]) == ("unknown", "reconcile")
            assert "predates value digests" in err["message"]
            verify_ok(b)
    assert [r.header("authorization") for r in srv.requests] == [f"Bearer {TOKEN_A.decode()}"]


async def test_an_approval_bound_to_a_bare_vault_counter_is_stale_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrade: an approval asked for before vault versions carried a value digest bound the
    bare counter; dispatched now it is APPROVAL_STALE, nothing sent, saying it is the upgrade."""
    vault = tmp_path / "v.vault"
    _vault(vault, "one", TOKEN_A)
    resolve = credential_step.resolve

    def as_before(ref: str, **kw: Any) -> Credential:  # what the older release bound
        got = resolve(ref, **kw)
        return Credential(got.ref, got.value, got.version.split(":")[0])

    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        cfg = approval_config(
            tmp_path,
            srv.url,
            approval={"methods": ["POST"], "wait": "20s"},
            credential="vault:deploy",
        )
        async with open_broker(_with_vault(cfg, vault)) as b:
            got: dict[str, Any] = {}

            async def caller() -> None:
                got["env"] = await b.call(CHARGE)

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    with monkeypatch.context() as m:
                        m.setattr(credential_step, "resolve", as_before)
                        nursery.start_soon(caller)
                        while not b.approvals():
                            await trio.sleep(0.02)
                    [waiting] = b.approvals()
                    assert waiting["version"] == "1"
                    await b.approve(waiting["invocation_id"], note="ok", operator=OPS)
            err = got["env"]["error"]
            assert (err["code"], err["phase"], err["outcome"]) == (
                "APPROVAL_STALE",
                "validation",
                "not_attempted",
            )
            assert "recorded before value digests" in err["message"], err
            verify_ok(b)
    assert srv.requests == []
