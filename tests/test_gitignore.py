"""The README's first commands, run from the checkout, leave nothing ``git add -A`` would pick
up: ``affidavit init`` writes the config, the journal and its lock, the sealing and signing
keys beside them; ``vault init`` and ``vault unlock`` the vault, its lock and its unlock file
(the vault's key).  Before, only the journal (``*.db``) was ignored: the keys were one commit
away from the repository.  Each file they make must match a pattern of ``.gitignore`` (read
here by name, as git matches a pattern without a slash in its middle)."""

from __future__ import annotations

import fnmatch
from pathlib import Path

from tests.broker.helpers import run_cli
from tests.layout import ROOT

PASSPHRASE = {"AFFIDAVIT_VAULT_PASSPHRASE": "correct horse battery staple"}


def _patterns() -> list[str]:
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(name: str, is_dir: bool, patterns: list[str]) -> bool:
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        if fnmatch.fnmatchcase(name, pattern.strip("/")):
            return True
    return False


def test_what_init_and_the_vault_make_in_the_checkout_is_ignored(tmp_path: Path) -> None:
    config = str(tmp_path / "affidavit.toml")
    for argv in (("init",), ("vault", "init"), ("vault", "unlock")):
        done = run_cli(*argv, "--config", config, env=PASSPHRASE)
        assert done.returncode == 0, (argv, done.stderr)
    made = {p.name: p.is_dir() for p in tmp_path.iterdir()}
    assert {"affidavit.toml", "affidavit.db.key", "affidavit.vault.unlock"} <= set(made), made
    patterns = _patterns()
    exposed = sorted(name for name, is_dir in made.items() if not _ignored(name, is_dir, patterns))
    assert exposed == [], exposed
