"""``affidavit vault init|put|list|lock|unlock``.

Secrets enter through stdin or a no-echo prompt, never argv: argv is visible to every user via the
process list and lands in shell history.  Nothing here ever prints a value or a passphrase.
The vault file comes from ``--vault`` or the ``[vault] path`` of the config (``--config``,
``$AFFIDAVIT_CONFIG``, ``./affidavit.toml``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from affidavit.cli import (
    SECRETS_ALWAYS,
    UsageError,
    config_refusal,
    refusal,
    stdin_bytes,
    stdin_is_terminal,
)

if TYPE_CHECKING:
    from affidavit.secrets.vault import VaultError

__all__ = ["PASSPHRASE_ENV_SHOWN", "add_commands"]

MAX_VALUE = 1024 * 1024
"""Bytes of a value ``vault put`` stores; more is PAYLOAD_LIMIT, never a value cut short."""
MAX_PASSPHRASE = 4096
"""Bytes of a ``--passphrase-stdin`` line (its final newline aside); a longer one is
PASSPHRASE_INVALID: cut, it would open the vault only from stdin, not from the variable or the
prompt that give it whole (rv45 finding 7)."""
TTY_LINE = 4095
"""Bytes of a terminal line the Linux tty keeps (its 4096-byte buffer, less the newline): what is
typed or pasted past them is dropped before ``getpass`` sees it.  A prompt entry this long may
have been cut, so it is refused -- pipe it on stdin instead -- never stored or set as read.
Linux only: macOS cuts a terminal line at 1024 bytes (MAX_CANON), which this does not catch."""
PASSPHRASE_ENV_SHOWN = "AFFIDAVIT_VAULT_PASSPHRASE"
"""``affidavit.secrets.vault.PASSPHRASE_ENV`` for the help text: importing the vault (and
cryptography) would cost every command's parser ~50 ms; a test checks the two agree."""


def add_commands(subparsers: Any) -> None:
    vault = subparsers.add_parser(
        "vault",
        help="manage the encrypted secrets vault",
        description="Create, fill, list, lock and unlock the encrypted vault file.",
    )
    sub = vault.add_subparsers(dest="vault_command", metavar="ACTION")
    sub.required = True

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--vault", metavar="PATH", help="vault file (default: [vault] path)")
        p.add_argument("--config", metavar="PATH", help="config file (for [vault] path)")

    p = sub.add_parser("init", help="create an empty vault (it starts locked)")
    common(p)
    p.add_argument(
        "--passphrase-stdin",
        action="store_true",
        help=f"read the passphrase from the first line of stdin, a pipe, not a terminal: at most "
        f"{MAX_PASSPHRASE} bytes (else ${PASSPHRASE_ENV_SHOWN} or a prompt)",
    )
    p.set_defaults(handler=_init, holds_secrets=SECRETS_ALWAYS)

    p = sub.add_parser(
        "put",
        help="store a secret read from stdin (never from the command line)",
        description="Read the value from stdin (or a no-echo prompt on a terminal).  A single-"
        "line value loses its final newline (`echo token | …`); multi-line values such as "
        "private keys are stored byte for byte.",
    )
    common(p)
    p.add_argument("name", help="entry name (A-Z a-z 0-9 _ . -)")
    p.set_defaults(handler=_put, holds_secrets=SECRETS_ALWAYS)

    p = sub.add_parser("list", help="list entries with their versions (never values)")
    common(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(handler=_list, holds_secrets=SECRETS_ALWAYS)

    p = sub.add_parser("lock", help="forget the stored key; every process sees the vault locked")
    common(p)
    p.set_defaults(handler=_lock, holds_secrets=SECRETS_ALWAYS)

    p = sub.add_parser("unlock", help="derive the key and store it for the broker (0600 file)")
    common(p)
    p.add_argument(
        "--passphrase-stdin",
        action="store_true",
        help=f"read the passphrase from the first line of stdin, a pipe, not a terminal: at most "
        f"{MAX_PASSPHRASE} bytes",
    )
    p.set_defaults(handler=_unlock, holds_secrets=SECRETS_ALWAYS)


def _refused(exc: VaultError, args: argparse.Namespace) -> UsageError:
    """A vault's refusal with its code and the field to fix: the entry's (``name``,
    ``value``), else the vault's path as it was given -- ``--vault``, or the config's
    ``vault.path``."""
    field = exc.field or ("--vault" if args.vault else "vault.path")
    return UsageError(str(exc), exc.code, field)


def _vault_path(args: argparse.Namespace) -> Path:
    from affidavit.config import ConfigError

    if args.vault:
        return Path(args.vault)
    from affidavit.api.trusted import load_trusted_config

    try:
        config = load_trusted_config(args.config)  # a planted config's vault: the planter's key
    except ConfigError as exc:
        raise config_refusal(exc, " (or pass --vault PATH)") from None
    if config.vault_path is None:
        raise UsageError(
            f"{config.path}: vault: no [vault] section (add one or pass --vault PATH)",
            "CONFIG_INVALID",
        )
    return config.vault_path


def _passphrase(args: argparse.Namespace, *, confirm: bool) -> str:
    from affidavit.secrets.credentials import trim_final_newline
    from affidavit.secrets.vault import PASSPHRASE_ENV

    if getattr(args, "passphrase_stdin", False):
        if stdin_is_terminal():
            # Read as a line, a terminal shows it as typed (on screen, in scrollback) and cuts
            # it at TTY_LINE bytes; its prompt reads it unshown and refuses a cut one.
            raise UsageError(
                "--passphrase-stdin, but stdin is a terminal, which would show the passphrase "
                f"and cut it at {TTY_LINE} bytes: leave --passphrase-stdin off to be asked for "
                "it without echo, or pipe it",
                "PASSPHRASE_INVALID",
            )
        # Room for a final CRLF, and a byte more tells a longer line.
        first = _read_stdin(
            MAX_PASSPHRASE + 2, "--passphrase-stdin reads", "PASSPHRASE_INVALID", line=True
        )
        line = trim_final_newline(first)
        if len(line) > MAX_PASSPHRASE:
            raise UsageError(
                f"the passphrase is longer than {MAX_PASSPHRASE} bytes", "PASSPHRASE_INVALID"
            )
        try:
            passphrase = line.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("the passphrase is not valid UTF-8", "PASSPHRASE_INVALID") from None
    elif os.environ.get(PASSPHRASE_ENV):
        passphrase = os.environ[PASSPHRASE_ENV]
    elif stdin_is_terminal():
        use = f"use --passphrase-stdin or ${PASSPHRASE_ENV}"
        passphrase = _prompt("Vault passphrase: ", use, "PASSPHRASE_INVALID")
        if confirm and _prompt("Repeat passphrase: ", use, "PASSPHRASE_INVALID") != passphrase:
            raise UsageError("the passphrases differ", "PASSPHRASE_INVALID")
    else:
        raise UsageError(
            f"no passphrase: use a terminal, --passphrase-stdin or ${PASSPHRASE_ENV}",
            "PASSPHRASE_INVALID",
        )
    if not passphrase:
        raise UsageError("the passphrase must not be empty", "PASSPHRASE_INVALID")
    return passphrase


def _read_stdin(
    n: int, what: str, code: str, field: str | None = None, *, line: bool = False
) -> bytes:
    """Up to ``n`` bytes of stdin (to the end of its first line: ``line``), refused with the
    command's ``code`` and ``field`` (``what`` reads it) when fd 0 is closed or cannot be read
    (an unconnected socket: EINVAL) -- never the FILE_UNUSABLE naming nothing the OSError was."""
    stdin = stdin_bytes(f"{what} stdin, which is closed", code, field)
    try:
        return stdin.readline(n) if line else stdin.read(n)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise refusal(f"{what} stdin, which cannot be read: {reason}", code, field) from None


def _prompt(
    text: str, instead: str, code: str, field: str | None = None, cut_code: str | None = None
) -> str:
    """An entry typed at the terminal, refused with ``code`` (and ``field``), saying to use
    ``instead``, when it is not UTF-8 as read -- mistyped, or cut mid-character by the tty
    ('é' * 2600) -- or none was given (Ctrl-D), and with ``cut_code`` (else ``code``) when it
    reached ``TTY_LINE`` bytes: never a traceback, whose UnicodeDecodeError names a byte of
    the entry."""
    import getpass

    try:
        entry = getpass.getpass(text)  # it restores the echo before anything propagates
    except EOFError:
        raise refusal("no entry was given (end of input at the prompt)", code, field) from None
    except UnicodeDecodeError:
        raise refusal(
            f"the entry is not valid UTF-8 as the terminal gave it, and may be cut (a terminal "
            f"keeps {TTY_LINE} bytes of a line, which can split a character): {instead}",
            code,
            field,
        ) from None
    if len(entry.encode("utf-8")) >= TTY_LINE:
        raise refusal(
            f"a terminal cuts a line at {TTY_LINE} bytes and this entry reached it (what "
            f"followed was dropped): {instead}",
            cut_code or code,
            field,
        )
    return entry


def _init(args: argparse.Namespace) -> int:
    from affidavit.secrets.vault import Vault, VaultError

    path = _vault_path(args)
    try:
        passphrase = _passphrase(args, confirm=True)
        Vault.init(path, passphrase)
    except VaultError as exc:
        raise _refused(exc, args) from None
    print(f"created {path} (locked); run `affidavit vault unlock` to use it")
    return 0


def _put(args: argparse.Namespace) -> int:
    from affidavit.secrets.credentials import trim_final_newline
    from affidavit.secrets.vault import Vault, VaultError, valid_entry_name

    if not valid_entry_name(args.name):
        raise refusal(
            "entry names are 1-128 characters of A-Z a-z 0-9 _ . -", "INVALID_FIELD", "name"
        )
    path = _vault_path(args)
    try:
        vault = Vault.open(path)
        vault.refuse_root_on_theirs()  # before the value is asked for, as is why it is locked
        vault.require_key()
        if stdin_is_terminal():
            pipe = f"pipe it on stdin (`... | affidavit vault put {args.name}`)"
            entry = _prompt(
                f"Value for {args.name}: ", pipe, "INVALID_FIELD", "value", "PAYLOAD_LIMIT"
            )
            raw = value = entry.encode("utf-8")
        else:
            # Room for a final CRLF and a byte more: trimmed first, a value of MAX_VALUE and
            # its newline hid whatever followed them -- stored cut, exit 0 (rv45 finding 6).
            raw = _read_stdin(MAX_VALUE + 3, "is read from", "INVALID_FIELD", "value")
            value = trim_final_newline(raw)
        if len(value) > MAX_VALUE or len(raw) > MAX_VALUE + 2:
            raise refusal(f"is larger than {MAX_VALUE} bytes", "PAYLOAD_LIMIT", "value")
        if not value:
            raise refusal("is empty (it is read from stdin)", "INVALID_FIELD", "value")
        version = vault.put(args.name, value)
    except VaultError as exc:
        raise _refused(exc, args) from None
    print(f"stored {args.name} version {version}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from affidavit.secrets.vault import Vault, VaultError

    path = _vault_path(args)
    try:
        entries = Vault.open(path).list()
    except VaultError as exc:
        raise _refused(exc, args) from None
    if args.json:
        print(
            json.dumps(
                [{"name": n, "version": v, "updated_at": t} for n, v, t in entries], indent=2
            )
        )
        return 0
    for name, version, updated in entries:
        stamp = datetime.datetime.fromtimestamp(updated, datetime.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        print(f"{name}\tv{version}\t{stamp}")
    return 0


def _lock(args: argparse.Namespace) -> int:
    from affidavit.secrets.vault import PASSPHRASE_ENV, Vault, VaultError

    path = _vault_path(args)
    try:
        Vault.open(path).lock()
    except VaultError as exc:
        raise _refused(exc, args) from None
    print(f"locked {path}")
    if os.environ.get(PASSPHRASE_ENV):
        print(
            f"affidavit: warning: ${PASSPHRASE_ENV} is set; processes that inherit it can still "
            "open the vault",
            file=sys.stderr,
        )
    return 0


def _unlock(args: argparse.Namespace) -> int:
    from affidavit.secrets.vault import Vault, VaultError

    path = _vault_path(args)
    try:
        vault = Vault.open(path)
        vault.refuse_root_on_theirs()  # before the passphrase is asked for
        vault.unlock(_passphrase(args, confirm=False))
    except VaultError as exc:
        raise _refused(exc, args) from None
    print(
        f"unlocked {path} (key in {vault.unlock_path}, mode 0600; `affidavit vault lock` ends it)"
    )
    return 0
