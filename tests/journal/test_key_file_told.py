"""A caller of the broker is told why a key file is refused, never where it lives
(``journal.told``): a view's reader loads the broker key again on every view, so a caller can
make the broker read a key file moved, replaced or made loose since it started.  The
operator's words (``str``) keep the path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from affidavit.journal import Journal, JournalError, JournalReader, told
from affidavit.journal.sealing import BrokerKey, load_auditor_private_key, read_pem_key

from .test_key_file_acl import _refusals_of_fifo


def _made(db: Path, key: Path | None = None) -> None:
    async def make() -> None:
        async with Journal.open(db, key_file=key):
            pass

    trio.run(make)


def _refused(read: object, path: Path) -> JournalError:
    with pytest.raises(JournalError) as caught:
        read(path)  # type: ignore[operator]
    return caught.value


def _both(exc: JournalError, path: Path) -> tuple[str, str]:
    """The operator's words (naming ``path``) and the caller's (naming no part of it)."""
    assert str(path) in str(exc), str(exc)
    said = told(exc)
    assert str(path.parent) not in said and path.name not in said, said
    return str(exc), said


def test_a_missing_key_file_is_told_without_its_path(tmp_path: Path) -> None:
    gone = tmp_path / "gone.key"
    _, said = _both(_refused(BrokerKey.load, gone), gone)
    assert said == "broker key file does not exist", said
    _, said = _both(_refused(load_auditor_private_key, gone), gone)
    assert said == "auditor private key file does not exist", said
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    _, said = _both(
        _refused(lambda p: read_pem_key(p, "public key file", X25519PublicKey), gone), gone
    )
    assert said == "public key file does not exist", said


def test_a_key_file_of_the_wrong_kind_is_told_without_its_path(tmp_path: Path) -> None:
    junk = tmp_path / "junk.key"
    fd = os.open(junk, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"not a key")
    os.close(fd)
    _, said = _both(_refused(BrokerKey.load, junk), junk)
    assert said == "broker key file is not an affidavit journal key", said
    _, said = _both(_refused(load_auditor_private_key, junk), junk)
    assert said == "auditor private key file is not a PEM private key", said
    ed = tmp_path / "ed.key"  # a PEM private key of another kind
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(ed, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, pem)
    os.close(fd)
    _, said = _both(_refused(load_auditor_private_key, ed), ed)
    assert said == "auditor private key file is not an X25519 key", said


def test_a_loose_or_fifo_key_file_is_told_without_its_path(tmp_path: Path) -> None:
    db = tmp_path / "j.db"
    _made(db)
    key = Path(f"{db}.key")
    key.chmod(0o620)  # write-only for the group: refused all the same
    _, said = _both(_refused(BrokerKey.load, key), key)
    assert said.startswith("broker key file "), said
    fifo = tmp_path / "fifo.key"
    os.mkfifo(fifo, 0o600)
    got = _refusals_of_fifo(fifo, BrokerKey.load, say=told)
    assert got == ["cannot read broker key file: is a FIFO (named pipe), not a regular file"]


def test_a_key_file_replaced_under_a_reader_is_told_without_its_path(tmp_path: Path) -> None:
    """A view's reader reloads its key (``reset``): the key moved away, then another key put at
    its path -- neither answer names it."""
    db = tmp_path / "j.db"
    key = tmp_path / "broker.key"
    _made(db, key)
    _made(tmp_path / "other.db", tmp_path / "other.key")
    with JournalReader.open(db, key_file=key) as reader:
        key.rename(tmp_path / "moved.key")
        reader.reset()
        with pytest.raises(JournalError) as caught:
            reader.holder_tag("act_1", "host:1")
        _, said = _both(caught.value, key)
        assert said == "broker key file does not exist", said
        (tmp_path / "other.key").rename(key)
        reader.reset()
        with pytest.raises(JournalError) as caught:
            reader.holder_tag("act_1", "host:1")
        _, said = _both(caught.value, key)
        assert said == "broker key file does not match this journal", said


def test_the_operators_command_line_is_told_the_path_a_caller_is_not(tmp_path: Path) -> None:
    """The same refusal, answered by the daemon to a caller (``read_failure``,
    ``result_failure``) and by the command line to the operator who runs it: only the
    operator's names the file to mend."""
    from affidavit.cli import journal_refusal
    from affidavit.cli.call import _result_refusal
    from affidavit.cli.journal import read_refusal
    from affidavit.engine import read_failure, result_failure

    gone = tmp_path / "gone.key"
    exc = _refused(BrokerKey.load, gone)
    for _status, _code, said in (
        read_failure(exc, "the actions view"),
        result_failure(exc, "act_x"),
    ):
        assert str(gone) not in said and gone.name not in said, said
    for refusal in (
        read_refusal(exc, "the actions view"),
        _result_refusal(exc, "act_x"),
        journal_refusal(exc),
    ):
        assert str(gone) in str(refusal), str(refusal)


def test_the_operators_acts_on_the_command_line_are_told_the_path_a_caller_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``affidavit operation poll``, ``approvals approve/deny`` and ``reconcile`` run embedded
    answer a journal that refused a key file as the operator's own (``act_failure``'s
    ``operator``): the path to mend; the same failure answered to a caller names none of it."""
    import argparse

    from affidavit.api.broker import Broker
    from affidavit.approvals.service import decision_failure
    from affidavit.cli import UsageError, approvals, operations
    from affidavit.engine import poll_failure
    from affidavit.reconcile.service import failure

    gone = tmp_path / "gone.key"
    exc = _refused(BrokerKey.load, gone)
    for _status, _code, said in (
        poll_failure(exc, "op_x"),
        decision_failure(exc, "act_x"),
        failure(exc, "act_x"),
    ):
        assert str(gone) not in said and gone.name not in said, said

    class RefusedOpen:  # as ``Broker.open`` does: the journal's refusal
        async def __aenter__(self) -> None:
            raise exc

        async def __aexit__(self, *_: object) -> None:
            return None

    def refused_open(**_: object) -> RefusedOpen:
        return RefusedOpen()

    monkeypatch.setattr(Broker, "open", refused_open)
    for module in (operations, approvals):
        monkeypatch.setattr(module, "load_or_usage", lambda _path: object())
    monkeypatch.setattr(approvals, "daemon_socket", lambda _args, _option: None)
    common = {"config": None, "note": None, "timeout": None, "invocation_id": "act_x"}
    for run, extra in (
        (operations._poll, {"operation_id": "op_x"}),
        (approvals._decide, {"verb": "approve", "blind": False}),
        (approvals._decide, {"verb": "deny", "blind": False}),
        (approvals._reconcile, {"query": True, "attest": None}),
    ):
        with pytest.raises(UsageError) as caught:
            run(argparse.Namespace(**common, **extra))
        assert str(gone) in str(caught.value), (run, str(caught.value))
