"""The mistakes an operator makes first -- a bad config file, none at all, a journal path that
cannot be a journal, a locked or missing vault -- each answered by the command line as one
line: ``affidavit: CODE: ...`` with a stable code, the setting or file to fix and what to do,
exit 2, never a traceback.  One row per mistake (h2's row tables): the command, how the
mistake is made, the code, and the words that must be in the line."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.external import require_root

from .helpers import TOKEN_ENV, http_target, run_cli, write_config

ACTION = json.dumps({"target": "api", "method": "GET", "path": "/x"}).encode()


def _config(tmp: Path, **journal: str) -> Path:
    table = journal or {"path": str(tmp / "journal.db")}
    return write_config(
        tmp, {"api": http_target("http://127.0.0.1:9")}, vault=str(tmp / "v"), journal=table
    )


def _unknown_setting(tmp: Path) -> Path:
    cfg = _config(tmp)
    cfg.write_text(cfg.read_text() + "bogus = 1\n")
    return cfg


def _bad_toml(tmp: Path) -> Path:
    cfg = tmp / "affidavit.toml"
    cfg.write_text("[journal\n")
    return cfg


def _missing_directory(tmp: Path) -> Path:
    return _config(tmp, path=str(tmp / "nope" / "journal.db"))


def _a_directory(tmp: Path) -> Path:
    (tmp / "d").mkdir()
    return _config(tmp, path=str(tmp / "d"))


def _socket_nowhere(tmp: Path) -> Path:
    cfg = _config(tmp)
    cfg.write_text(cfg.read_text() + f'\n[service]\nsocket = "{tmp / "nope" / "a.sock"}"\n')
    return cfg


def _initialized(tmp: Path) -> Path:
    done = run_cli("init", "--config", str(tmp / "affidavit.toml"))
    assert done.returncode == 0, done.stderr
    return tmp / "affidavit.toml"


def _locked_vault(tmp: Path) -> Path:
    cfg = _config(tmp)
    done = run_cli("vault", "init", "--config", str(cfg), "--passphrase-stdin", stdin=b"pw\n")
    assert done.returncode == 0, done.stderr
    return cfg


def _key_gone(name: str) -> Callable[[Path], Path]:
    """A journal moved or copied without one of its key files."""

    def make(tmp: Path) -> Path:
        cfg = _initialized(tmp)
        (tmp / name).unlink()
        return cfg

    return make


def _another_journals(name: str) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        cfg = _initialized(tmp)
        (tmp / "other").mkdir()
        _initialized(tmp / "other")
        (tmp / name).write_bytes((tmp / "other" / name).read_bytes())
        return cfg

    return make


@dataclass(frozen=True)
class Mistake:
    args: tuple[str, ...]
    make: Callable[[Path], Path]
    code: str
    says: tuple[str, ...]
    """what the line must hold: the field or file to fix, and the fix"""


MISTAKES = {
    "unknown setting": Mistake(
        ("call", "-"), _unknown_setting, "CONFIG_INVALID", ("targets.api.bogus", "unknown")
    ),
    "invalid TOML": Mistake(("actions",), _bad_toml, "CONFIG_INVALID", ("invalid TOML", "line 1")),
    "no config file": Mistake(
        ("actions",),
        lambda tmp: tmp / "absent.toml",
        "CONFIG_NOT_FOUND",
        ("absent.toml", "affidavit init"),
    ),
    "journal directory missing": Mistake(
        ("call", "-"),
        _missing_directory,
        "JOURNAL_UNUSABLE",
        ("nope", "[journal] path", "--journal"),
    ),
    "journal never created": Mistake(
        ("actions",),
        _config,
        "JOURNAL_UNREADABLE",
        ("journal.db", "affidavit init", "[journal] path"),
    ),
    "journal is a directory": Mistake(
        ("actions",),
        _a_directory,
        "JOURNAL_UNREADABLE",
        ("it is a directory", "[journal] path"),
    ),
    "socket directory missing": Mistake(
        ("serve",), _socket_nowhere, "SERVE_FAILED", ("nope", "does not exist", "mkdir -m 0750")
    ),
    "a key file named on the command line is missing": Mistake(
        ("journal", "verify", "--public-key", "/nonexistent/affidavit-test.pub"),
        _config,
        "FILE_UNUSABLE",
        ("/nonexistent/affidavit-test.pub", "does not exist"),
    ),
    "an --out file in a missing directory": Mistake(
        ("journal", "public-key", "--out", "/nonexistent/affidavit-test/journal.pub"),
        _initialized,
        "FILE_UNUSABLE",
        ("cannot write public key file /nonexistent/affidavit-test/journal.pub",),
    ),
    "the journal's broker key file is gone": Mistake(
        ("call", "-"),
        _key_gone("affidavit.db.key"),
        "JOURNAL_UNUSABLE",
        ("affidavit.db.key does not exist", "restore the file", "[journal] key_file"),
    ),
    "the journal's signing key file is gone": Mistake(
        ("call", "-"),
        _key_gone("affidavit.db.signing.key"),
        "JOURNAL_UNUSABLE",
        ("affidavit.db.signing.key does not exist", "restore the file", "[journal] signing_key"),
    ),
    "another journal's broker key file": Mistake(
        ("call", "-"),
        _another_journals("affidavit.db.key"),
        "JOURNAL_UNUSABLE",
        ("affidavit.db.key does not match journal", "[journal] key_file"),
    ),
    "another journal's signing key file": Mistake(
        ("call", "-"),
        _another_journals("affidavit.db.signing.key"),
        "JOURNAL_UNUSABLE",
        ("affidavit.db.signing.key does not match journal", "[journal] signing_key"),
    ),
    "vault locked": Mistake(
        ("vault", "put", "tok"), _locked_vault, "VAULT_LOCKED", ("affidavit vault unlock",)
    ),
    "vault missing": Mistake(
        ("vault", "list"), _config, "VAULT_MISSING", ("affidavit vault init",)
    ),
}


@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_an_operator_mistake_is_one_line_with_a_code_the_place_and_the_fix(
    tmp_path: Path, name: str
) -> None:
    m = MISTAKES[name]
    cfg = m.make(tmp_path)
    done = run_cli(*m.args, "--config", str(cfg), env={TOKEN_ENV: "tok"}, stdin=ACTION)
    line = done.stderr.decode()
    assert done.returncode == 2, (done.returncode, line)
    assert "Traceback" not in line and line.count("\n") == 1, line
    assert line.startswith(f"affidavit: {m.code}: "), line
    for words in m.says:
        assert words in line, (words, line)


def test_a_locked_vault_at_call_time_says_how_to_unlock_it(tmp_path: Path) -> None:
    """The envelope's VAULT_LOCKED names the setting (``field``) and, in its message, the
    command that unlocks the vault -- the contract's "unlock it, then retry"."""
    cfg = _locked_vault(tmp_path)
    text = cfg.read_text().replace(f'"env:{TOKEN_ENV}"', '"vault:tok"')
    cfg.write_text(text)
    done = run_cli("call", "-", "--config", str(cfg), stdin=ACTION)
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert (error["code"], error["field"]) == ("VAULT_LOCKED", "targets.api.credential")
    assert "affidavit vault unlock" in error["message"], error


CANARY = "CANARY-vaultdir-4e91"
CANARY_UID = 47311


def test_a_refused_unlock_file_tells_the_caller_no_path_nor_uid(tmp_path: Path) -> None:
    """``VaultLocked`` carries the unlock file's path and its refusal's words (here: owned by
    uid N, run as root -- run as its owner); the caller's envelope gets the fixed words of
    ``credentials.resolve`` (VAULT_LOCKED), the operator's log the rest."""
    require_root()  # to give the unlock file to another user
    home = tmp_path / CANARY
    home.mkdir()
    cfg = _locked_vault(home)
    done = run_cli("vault", "unlock", "--config", str(cfg), "--passphrase-stdin", stdin=b"pw\n")
    assert done.returncode == 0, done.stderr
    unlock = home / "v.unlock"
    os.chown(unlock, CANARY_UID, CANARY_UID)  # refused when read as root: its owner rewrites it
    cfg.write_text(cfg.read_text().replace(f'"env:{TOKEN_ENV}"', '"vault:tok"'))
    done = run_cli("call", "-", "--config", str(cfg), stdin=ACTION)
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert (error["code"], error["field"]) == ("VAULT_LOCKED", "targets.api.credential")
    shown = done.stdout.decode()
    for secret in (CANARY, str(CANARY_UID), "v.unlock", str(tmp_path)):
        assert secret not in shown, (secret, shown)
    # The operator's log names the file and the fix (run as its owner, not chown it to root).
    assert f"{unlock}: cannot read the unlock file" in done.stderr.decode(), done.stderr
    assert f"sudo -u '#{CANARY_UID}'" in done.stderr.decode(), done.stderr
