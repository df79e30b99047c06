"""A ``file:`` credential is read inside the event loop, so it must never block the broker or
exhaust its memory (affidavit/privatefile.py): a FIFO, a device, a directory or a file over
``MAX_CREDENTIAL_BYTES`` is CREDENTIAL_INVALID (credential_injection, not_attempted, nothing
sent), its message naming the reference and what is wrong -- never a byte of the contents."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from affidavit.api.broker import Broker
from affidavit.cli.tour import DemoServer, demo_config
from affidavit.config import load_config
from affidavit.secrets.credentials import MAX_CREDENTIAL_BYTES, CredentialError, resolve
from affidavit.secrets.vault import Vault
from affidavit.statemachine import Code, EventKind
from affidavit.views import event_to_json, record_to_json

CANARY = "CANARY-f1le-cred-5e9b07"


@pytest.fixture(autouse=True)
def _capture_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.DEBUG)
    yield
    assert CANARY not in caplog.text


@contextlib.contextmanager
def unblock_after(fifo: Path, seconds: float) -> Iterator[None]:
    """Without the fix, ``open(fifo)`` blocks the whole trio thread and no ``fail_after`` can
    fire: after ``seconds`` this opens the FIFO's writing end (once a reader waits), so a
    regression fails the test with TooSlowError instead of hanging the suite."""
    done = threading.Event()

    def watchdog() -> None:
        if done.wait(seconds):
            return
        while not done.is_set():
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet
                done.wait(0.05)
                continue
            os.close(fd)
            return

    thread = threading.Thread(target=watchdog, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _refused(ref: str, **kw: object) -> CredentialError:
    with pytest.raises(CredentialError) as info:
        resolve(ref, vault=None, **kw)  # type: ignore[arg-type]
    assert info.value.code is Code.CREDENTIAL_INVALID
    assert str(info.value).startswith(f"CREDENTIAL_INVALID: {ref}: ")
    assert CANARY not in str(info.value)
    return info.value


def test_fifo_credential_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "cred.fifo"
    os.mkfifo(fifo)
    with unblock_after(fifo, 3):
        err = _refused(f"file:{fifo}")
    assert "FIFO" in err.message and "not a regular file" in err.message


def test_dev_zero_and_directories_are_refused() -> None:
    # In a child under a 512 MiB address-space limit: were /dev/zero ever read again, the child
    # fails with MemoryError instead of the test machine running out of memory.
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))\n"
        "from affidavit.secrets.credentials import CredentialError, resolve\n"
        "for ref in ('file:/dev/zero', 'file:/'):\n"
        "    try:\n"
        "        resolve(ref, vault=None)\n"
        "    except CredentialError as exc:\n"
        "        print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == [
        "CREDENTIAL_INVALID: file:/dev/zero: is a character device, not a regular file",
        "CREDENTIAL_INVALID: file:/: is a directory, not a regular file",
    ]


def test_credential_file_size_is_capped(tmp_path: Path) -> None:
    at_limit = tmp_path / "at_limit"
    at_limit.write_bytes(CANARY.encode() + b"x" * (MAX_CREDENTIAL_BYTES - len(CANARY)))
    at_limit.chmod(0o600)
    assert len(resolve(f"file:{at_limit}", vault=None).value) == MAX_CREDENTIAL_BYTES
    over = tmp_path / "over"
    over.write_bytes(CANARY.encode() + b"x" * (MAX_CREDENTIAL_BYTES + 1 - len(CANARY)))
    over.chmod(0o600)
    assert "larger than the 64 KiB limit" in _refused(f"file:{over}").message
    huge = tmp_path / "huge"  # sparse: 100 MB is never read into memory
    with open(huge, "wb") as fh:
        fh.write(CANARY.encode())
        fh.truncate(100 * 1024 * 1024)
    huge.chmod(0o600)
    assert "larger than the 64 KiB limit" in _refused(f"file:{huge}").message


async def test_fifo_credential_answers_and_the_broker_keeps_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AFFIDAVIT_DEMO_TOKEN", CANARY)
    fifo = tmp_path / "cred.fifo"
    os.mkfifo(fifo)
    server = DemoServer()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        text = demo_config(tmp_path, port)
        api, payments = text.split("[targets.payments]")
        payments = payments.replace('"env:AFFIDAVIT_DEMO_TOKEN"', f'"file:{fifo}"')
        cfg = tmp_path / "affidavit.toml"
        cfg.write_text(api + "[targets.payments]" + payments, encoding="utf-8")
        with unblock_after(fifo, 5), trio.fail_after(15):
            async with Broker.open(config=load_config(cfg)) as broker:
                results: dict[str, dict[str, object]] = {}

                async def call(name: str, action: dict[str, str]) -> None:
                    results[name] = await broker.call(action)

                async with trio.open_nursery() as calls:
                    calls.start_soon(
                        call,
                        "fifo",
                        {"target": "payments", "method": "POST", "path": "/p", "body": "{}"},
                    )
                    calls.start_soon(
                        call, "api", {"target": "api", "method": "GET", "path": "/hello"}
                    )
                refused = results["fifo"]
                err = refused["error"]
                assert isinstance(err, dict)
                assert (err["code"], err["phase"], err["outcome"]) == (
                    "CREDENTIAL_INVALID",
                    "credential_injection",
                    "not_attempted",
                )
                assert refused["evidence"]["dispatch_started"] is False  # type: ignore[index]
                ok = results["api"]
                assert "error" not in ok, ok
                assert server.requests == 1  # only the api call reached the server
                record = broker.record(str(refused["invocation_id"]))
                assert record is not None and record.final
                after = await broker.call({"target": "api", "method": "GET", "path": "/hello"})
                assert "error" not in after, after
                assert CANARY not in json.dumps([refused, ok, after])
        nursery.cancel_scope.cancel()


def test_fifo_vault_and_unlock_file_are_refused_without_blocking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AFFIDAVIT_VAULT_PASSPHRASE", raising=False)
    vault = Vault.init(tmp_path / "v.vault", "pw", n_log2=10)
    vault.unlock("pw")
    vault.put("api", CANARY.encode())
    vault.unlock_path.unlink()
    os.mkfifo(vault.unlock_path)
    with unblock_after(vault.unlock_path, 3), pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=vault)
    assert info.value.code is Code.VAULT_LOCKED
    assert "FIFO" in str(info.value) and CANARY not in str(info.value)
    fifo_vault = Vault(tmp_path / "fifo.vault")
    os.mkfifo(fifo_vault.path)
    with unblock_after(fifo_vault.path, 3), pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=fifo_vault)
    assert info.value.code is Code.CREDENTIAL_INVALID
    assert "FIFO" in str(info.value)


async def test_credential_errors_name_the_field_and_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CREDENTIAL_MISSING / CREDENTIAL_INVALID tell the caller the field path to fix and what is
    wrong, but not the reference (a file path, a variable name: where the broker keeps its
    secrets is not an agent's business) -- neither in the envelope nor in the record and events
    a caller can read back.  The operator's detail, logged and sealed with CREDENTIAL_FAILED,
    names it.  Never the value anywhere."""
    caplog.set_level(logging.WARNING, logger="affidavit.engine")
    monkeypatch.delenv("AFF_TEST_NEVER_SET", raising=False)
    monkeypatch.setenv("AFF_TEST_SPACED", f"{CANARY} with spaces")
    big = tmp_path / "big"
    big.write_bytes(CANARY.encode() * 4096)
    big.chmod(0o600)
    refs = {
        "unset": "env:AFF_TEST_NEVER_SET",
        "spaced": "env:AFF_TEST_SPACED",
        "big": f"file:{big}",
    }
    text = demo_config(tmp_path, 9).split("[targets.payments]")[0]
    for name, ref in refs.items():
        text += (
            f'\n[targets.{name}]\nkind = "http"\nurl = "http://127.0.0.1:9"\n'
            f'methods = ["GET"]\ncredential = "{ref}"\ninject = "bearer"\n'
        )
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(text, encoding="utf-8")
    hidden_reasons = {"unset": "environment variable AFF_TEST_NEVER_SET is not set or empty"}
    expected = {
        "unset": ("CREDENTIAL_MISSING", "environment variable is not set or empty"),
        "spaced": ("CREDENTIAL_INVALID", "a bearer token has no spaces"),
        "big": ("CREDENTIAL_INVALID", "larger than the 64 KiB limit"),
    }
    envs = []
    with trio.fail_after(15):
        async with Broker.open(config=load_config(cfg)) as broker:
            for name, (code, reason) in expected.items():
                env = await broker.call({"target": name, "method": "GET", "path": "/"})
                err = env["error"]
                assert err["code"] == code, err
                assert err["field"] == f"targets.{name}.credential"
                assert reason in err["message"], err
                fetched = await broker.fetch_result(env["invocation_id"])
                assert fetched["error"]["message"] == err["message"]
                iid = env["invocation_id"]
                seen = json.dumps([env, fetched, record_to_json(broker.record(iid))])
                seen += json.dumps([event_to_json(e) for e in broker.events(iid)])
                hidden = refs[name].split(":", 1)[1]  # the variable's name, the file's path
                assert hidden not in seen and refs[name] not in seen
                failed = broker.events(iid)[-1]
                assert failed.kind is EventKind.CREDENTIAL_FAILED and failed.seq is not None
                detail = broker.journal.payload(failed.seq)
                assert detail is not None and detail["detail"].startswith(f"{refs[name]}: ")
                assert (hidden_reasons.get(name) or reason) in detail["detail"]
                assert any(detail["detail"] in r.getMessage() for r in caplog.records)
                envs.append(env)
    assert CANARY not in json.dumps(envs)
    assert CANARY not in caplog.text
    journal = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("demo.db"))
    assert journal and CANARY.encode() not in journal


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o444], ids=lambda m: f"{m:04o}")
def test_credential_file_others_can_access_is_refused(tmp_path: Path, mode: int) -> None:
    """The rule of ``key_file`` and ``signing_key``: a secret group or others can read is
    refused, the message saying how to fix it."""
    tok = tmp_path / "tok"
    tok.write_bytes(CANARY.encode())
    tok.chmod(mode)
    err = _refused(f"file:{tok}")
    assert f"(mode {mode:04o}); it must be 0600: chmod 600 {tok}" in err.detail
    assert f"(mode {mode:04o}); it must be 0600" in err.message  # the caller's ...
    assert str(tmp_path) not in err.message  # ... without the path
    for ok in (0o600, 0o400):
        tok.chmod(ok)
        assert resolve(f"file:{tok}", vault=None).value == CANARY.encode()


def test_a_missing_relative_credential_file_names_where_it_was_looked_for(tmp_path: Path) -> None:
    """``file:tok`` is read from the config file's directory, not the working one: the error
    says which file was missing, so the operator does not look for it in the wrong place."""
    with pytest.raises(CredentialError) as caught:
        resolve("file:secrets/tok", vault=None, base_dir=tmp_path)
    assert caught.value.code is Code.CREDENTIAL_MISSING
    assert caught.value.detail == (
        f"file:secrets/tok: file not found (read as {tmp_path / 'secrets' / 'tok'}: relative "
        "to the config file's directory): create it (mode 0600, the broker's user's) or name "
        "another file in the target's credential"
    )
    assert caught.value.message == "file not found"  # the caller's: no reference, no path


def test_each_missing_credential_tells_the_operator_the_fix(tmp_path: Path) -> None:
    """A credential that is absent or empty: the operator's words (the log line, the sealed
    CREDENTIAL_FAILED) say what to do -- create or fill the file, configure the vault, store the
    entry -- not only what is wrong; the caller's stay the short ones, without a path or name."""
    empty = tmp_path / "empty.tok"
    empty.write_bytes(b"\n")
    empty.chmod(0o600)
    v = Vault.init(tmp_path / "s.vault", "pass phrase", n_log2=10)
    v.unlock("pass phrase")
    cases = [
        (f"file:{tmp_path / 'absent.tok'}", None, "file not found", "create it (mode 0600"),
        (f"file:{empty}", None, "file is empty", "write the credential into it"),
        ("vault:api", None, "no vault is configured", "set [vault] path"),
        ("vault:api", v, "no vault entry with that name", "`affidavit vault put api`"),
    ]
    for ref, vault, public, fix in cases:
        with pytest.raises(CredentialError) as caught:
            resolve(ref, vault=vault)
        assert caught.value.code is Code.CREDENTIAL_MISSING, ref
        assert caught.value.message == public, ref
        assert caught.value.detail.startswith(f"{ref}: "), caught.value.detail
        assert fix in caught.value.detail, caught.value.detail
        assert str(tmp_path) not in caught.value.message


def test_symlinked_credential_is_judged_by_the_file_it_names(tmp_path: Path) -> None:
    target = tmp_path / "real"
    target.write_bytes(CANARY.encode())
    target.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(target)  # a symlink itself is 0777: its target's mode is what counts
    assert resolve(f"file:{link}", vault=None).value == CANARY.encode()
    target.chmod(0o644)
    assert "mode 0644" in _refused(f"file:{link}").message


def test_world_readable_unlock_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AFFIDAVIT_VAULT_PASSPHRASE", raising=False)
    vault = Vault.init(tmp_path / "v.vault", "pw", n_log2=10)
    vault.unlock("pw")
    vault.put("api", CANARY.encode())
    vault.unlock_path.chmod(0o644)
    with pytest.raises(CredentialError) as info:
        resolve("vault:api", vault=vault)
    assert info.value.code is Code.VAULT_LOCKED
    assert "mode 0644" in str(info.value) and CANARY not in str(info.value)


async def test_a_success_shows_the_credential_version_not_its_reference(tmp_path: Path) -> None:
    """A success's ``evidence.credential`` proves which value was used (its version) without
    telling the caller where the broker keeps it: no reference, no path -- in the envelope,
    the record or the events a caller reads back."""
    token = tmp_path / "where-the-token-lives.txt"
    token.write_bytes(CANARY.encode() + b"\n")
    token.chmod(0o600)
    cfg = tmp_path / "affidavit.toml"
    server = DemoServer()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve)
        cfg.write_text(
            demo_config(tmp_path, port).replace(
                'credential = "env:AFFIDAVIT_DEMO_TOKEN"', f'credential = "file:{token}"'
            ),
            encoding="utf-8",
        )
        with trio.fail_after(15):
            async with Broker.open(config=load_config(cfg)) as broker:
                env = await broker.call({"target": "api", "method": "GET", "path": "/hello"})
                assert "error" not in env, env
                iid = env["invocation_id"]
                record = broker.record(iid)
                assert record is not None
                seen = json.dumps([env, record_to_json(record)])
                seen += json.dumps([event_to_json(e) for e in broker.events(iid)])
        nursery.cancel_scope.cancel()
    assert env["evidence"]["credential"]["version"]
    assert token.name not in seen and CANARY not in seen


class _NoParent(type(Path())):  # type: ignore[misc]
    """A config path whose directory must not be asked for."""

    @property
    def parent(self) -> Path:  # type: ignore[override]
        raise AssertionError("the config's directory was computed for a non-file reference")


def test_the_credential_step_reads_a_relative_file_from_the_config_dir_only_for_file_refs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: ``prepare_request`` computes the config's directory only for a ``file:``
    reference (the only kind read relative to it), not on every call of an ``env:`` one --
    and a relative ``file:`` reference is still read from that directory."""
    from types import SimpleNamespace

    from affidavit.engine.credential import prepare_request
    from affidavit.secrets.redaction_plan import release

    (tmp_path / "tok").write_bytes(CANARY.encode())
    (tmp_path / "tok").chmod(0o600)
    monkeypatch.setenv("AFFIDAVIT_TEST_CRED_DIR", "env-secret-value")
    seen: list[bytes] = []

    def prepare(action: object, target: object, credential: object, *_: object) -> object:
        seen.append(credential.value)  # type: ignore[attr-defined]
        return SimpleNamespace(secrets=(credential.value,))  # type: ignore[attr-defined]

    binding = SimpleNamespace(prepare=prepare)
    journal = SimpleNamespace(keyed_digest=lambda label, data: "d" * 64)
    for ref, path in (
        ("env:AFFIDAVIT_TEST_CRED_DIR", _NoParent(tmp_path / "affidavit.toml")),
        ("file:tok", tmp_path / "affidavit.toml"),
    ):
        engine = SimpleNamespace(
            config=SimpleNamespace(path=path),
            vault=None,
            journal=journal,
            snapshot=SimpleNamespace(trusted=lambda target, recorded: {}),
        )
        try:
            prepare_request(engine, {}, SimpleNamespace(credential=ref), binding, None, {})  # type: ignore[arg-type]
        finally:
            release(id(engine))  # the credential's redaction plans, as a closing broker does
    assert seen == [b"env-secret-value", CANARY.encode()]
