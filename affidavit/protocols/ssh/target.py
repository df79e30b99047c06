"""An SSH target's settings, each declared once (``SSH_TARGET``), and the normalized value the
engine binds (``SshTarget``).  The host key is pinned: given inline (``host_key``, one key or a
list for rotation) or read once from an OpenSSH ``known_hosts`` file at load time."""

from __future__ import annotations

import base64
import binascii
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from affidavit.adapters.ssh.known_hosts import known_host_keys
from affidavit.schema import (
    COMMON,
    ApprovalPolicy,
    ConfigError,
    Field,
    Read,
    TargetSchema,
    Timeouts,
    approval_field,
    host_setting,
    same,
)

from .reconcile import ReconcileCommand, parse_reconcile

__all__ = ["SSH_TARGET", "SshTarget"]

_SSH_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@\-]{0,63}")
_SSH_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)


@dataclass(frozen=True)
class SshTarget:
    name: str
    host: str
    port: int
    user: str
    host_keys: tuple[str, ...]
    """Pinned keys as ``"<type> <base64>"``, sorted, from ``host_key`` or ``known_hosts``."""
    credential: str
    idempotent_commands: frozenset[str]
    budget: int
    timeout: Timeouts
    max_result: int | None
    """``max_result`` as set (None: the default, ``affidavit.schema.result_limit``)."""
    max_stdin: int
    approval: ApprovalPolicy | None
    """Which commands wait for an operator's yes (``affidavit.schema.approval``)."""
    reconcile: ReconcileCommand | None
    """The command that settles an unknown outcome (``reconcile.py``)."""
    known_hosts: Path | None = None
    """The ``known_hosts`` file ``host_keys`` were read from (None: given inline); not bound
    (the keys are), looked at by a broker's start (``Field.trust_anchor``)."""
    auth: Literal["password"] | None = None
    """``"password"``: the credential is sent as a password.  None (``auth = "key"``, the
    default): it must be a private key -- a token or a ``.pub`` file is refused before
    connecting, never sent."""
    kind: Literal["ssh"] = "ssh"


def check_host_key(line: str) -> str:
    """``"<type> <base64> [comment]"`` -> ``"<type> <base64>"`` after checking the blob's own
    type name matches (RFC 4253 §6.6: the blob starts with the key type string)."""
    fields = line.split()
    if len(fields) < 2:
        raise ValueError('must look like "ssh-ed25519 AAAA…"')
    key_type, b64 = fields[0], fields[1]
    if key_type not in _SSH_KEY_TYPES and len(fields) > 2 and fields[1] in _SSH_KEY_TYPES:
        # `ssh-keyscan` and known_hosts lines start with the host: the pin is the key alone.
        raise ValueError(
            f'starts with "{fields[0]}", not a key type: give the key alone, without the '
            f'host name of an ssh-keyscan or known_hosts line ("{fields[1]} AAAA…")'
        )
    if key_type not in _SSH_KEY_TYPES:
        raise ValueError(f"unsupported key type (supported: {', '.join(sorted(_SSH_KEY_TYPES))})")
    try:
        blob = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("key data is not valid base64") from None
    if len(blob) < 4:
        raise ValueError("key data is truncated")
    (n,) = struct.unpack(">I", blob[:4])
    if blob[4 : 4 + n] != key_type.encode():
        raise ValueError("key data does not match its key type")
    return f"{key_type} {b64}"


def _user(r: Read) -> str:
    user: str = r.string(max_len=64)
    if not _SSH_USER.fullmatch(user):
        raise r.error("must be a plain user name (A-Z a-z 0-9 _ . @ -)")
    return user


def _auth(r: Read) -> str | None:
    if not r.present:
        return None
    value = r.string(max_len=16)
    if value not in ("key", "password"):
        raise r.error('must be "key" or "password"')
    # "key" is the default and stays out of the snapshot (targets written before this setting
    # keep their hash); only "password" binds.
    return None if value == "key" else value


def _host_keys(r: Read) -> tuple[str, ...]:
    """``host_key`` (reported at that key) or ``known_hosts``: exactly one of them."""
    s = r.section
    if s.has("host_key") == s.has("known_hosts"):
        raise r.error("set exactly one of host_key or known_hosts")
    if s.has("host_key"):
        raw = s.get("host_key")
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not items:
            raise r.error("must be a key string or an array of them")
        found = set()
        for i, item in enumerate(items):
            at = "" if isinstance(raw, str) else f"[{i}]"
            if not isinstance(item, str):
                raise r.error("must be a string", at)
            try:
                found.add(check_host_key(item))
            except ValueError as exc:
                raise r.error(str(exc), at) from None
        return tuple(sorted(found))
    where = s.path("known_hosts")
    kh = r.resolve_path(s.string("known_hosts"))
    try:
        text = kh.read_text("utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(where, f"cannot read {kh} ({exc.strerror})") from None
    keys = known_host_keys(text, r.values["host"], r.values["port"])
    if not keys:
        raise ConfigError(where, f"{kh} has no usable key for this host")
    return keys


def _known_hosts(r: Read) -> Path | None:
    """The file ``host_keys`` read the pinned keys from (None: they are given inline), kept
    so that a broker's start can check who may write it (``Field.trust_anchor``)."""
    return r.resolve_path(r.string()) if r.present else None


SSH_TARGET = TargetSchema(
    "ssh",
    SshTarget,
    (
        Field("host", host_setting, doc="host name or IP address", account=same),
        Field("port", lambda r: r.integer(1, 65535), default=22, doc="TCP port", account=same),
        Field("user", _user, doc="remote user name", account=same),
        Field(
            "host_keys",
            _host_keys,
            key="host_key",
            shown="one of these two",
            doc='pinned key `"ssh-ed25519 AAAA…"` (or an array, for rotation)',
            account=same,  # whom the query trusts to be the host
        ),
        Field(
            "known_hosts",
            _known_hosts,
            default=None,
            shown="",
            doc="OpenSSH known_hosts file; entries for `host` (`[host]:port` when not 22), "
            "hashed entries supported, `@revoked` honoured, `@cert-authority` ignored",
            binding=False,
            reason="the keys read from it bind, as host_keys; the path alone changes no peer",
            trust_anchor="known_hosts file",
        ),
        *COMMON,
        Field(
            "auth",
            _auth,
            default=None,
            unset_omitted=True,
            shown='`"key"`',
            doc='`"key"`: the credential is an OpenSSH or PEM private key; `"password"`: it is '
            "sent as the password (an explicit choice: a key, token or `.pub` file is never "
            "guessed to be one)",
        ),
        Field(
            "idempotent_commands",
            lambda r: frozenset(r.string_list()),
            default=[],
            doc="exact command strings known to be safe to repeat; a call that sends stdin (even"
            " empty) is never idempotent, since the listing cannot vouch for the input (`sh`,"
            " `python3`, `psql` run the caller's code)",
        ),
        Field(
            "max_stdin",
            lambda r: r.integer(0, 1 << 40),
            default=1024 * 1024,
            doc="stdin limit in bytes",
        ),
        approval_field("commands"),
        Field(
            "reconcile",
            parse_reconcile,
            default=None,
            unset_omitted=True,
            doc="`{ command, committed_if, rejected_if, settle }`: the command that settles an "
            "unknown outcome (see [approvals](approvals.md#reconciliation))",
        ),
    ),
)
