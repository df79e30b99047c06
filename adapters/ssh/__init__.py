"""SSH adapter: a protocol table (``table.py``), a non-blocking ssh-python/libssh trio driver
(``driver.py``, with ``connect.py``, ``libssh.py`` and ``exit_report.py``) and in-memory
credentials plus host-key pins (``keys.py``).

Importing this package registers ``SSH_TABLE`` with the framework."""

from __future__ import annotations

from .driver import CHUNK, SshTarget, SshTimeouts, perform
from .keys import (
    CredentialInvalid,
    SshCredential,
    fingerprint,
    load_known_hosts,
    parse_pin,
    prepare_credential,
)
from .table import SSH_TABLE

__all__ = [
    "CHUNK",
    "SSH_TABLE",
    "CredentialInvalid",
    "SshCredential",
    "SshTarget",
    "SshTimeouts",
    "fingerprint",
    "load_known_hosts",
    "parse_pin",
    "perform",
    "prepare_credential",
]
