"""The commented sample ``affidavit init`` writes (tested to load cleanly)."""

from __future__ import annotations

from pathlib import Path

from affidavit.privatefile import write_private_file

__all__ = ["sample_config", "write_config"]

_SAMPLE = """\
# Affidavit configuration.  Relative paths resolve against this file's directory.
# Reference: docs/configuration.md

[journal]
path = "affidavit.db"               # the append-only evidence journal (SQLite)
# key_file = "affidavit.db.key"     # broker sealing key (default: <path>.key)
# signing_key = "affidavit.db.signing.key"  # signs checkpoints (default: <path>.signing.key);
#                                   # `affidavit journal public-key` exports it for auditors
# auditor_public_key = "auditor.pub"  # from `affidavit journal audit-keygen` on the auditor's host

[vault]
path = "affidavit.vault"            # `affidavit vault init`, then `affidavit vault put NAME`

# `affidavit serve`: the broker as its own process (docs/deployment.md).
# [service]
# socket = "affidavit.sock"           # Unix socket, created mode 0660
# allow_uids = [1001]                 # default: the uid the daemon runs as
# allow_gids = []                     # or: the group of the socket's users
# shutdown_grace = 30                 # seconds in-flight calls may finish after SIGTERM
# operator_uids = [1002]              # who may approve, deny and attest (docs/approvals.md);
#                                     # never an agent's account
# console = "127.0.0.1:8470"          # the operator console, loopback (docs/console.md);
#                                     # log in with `affidavit console-url`

# An HTTP target.  The caller names it; the broker injects the credential.
[targets.example]
kind = "http"
url = "https://api.example.com/v1"   # origin plus an optional base path
methods = ["GET", "POST"]             # what callers may send
idempotent = ["GET"]                  # methods THIS service treats as idempotent (retried on
                                      # unknown outcome); never assumed from the method name
credential = "env:EXAMPLE_TOKEN"      # env:NAME | file:PATH | systemd:NAME | vault:NAME
inject = "bearer"                     # bearer | basic | header:NAME | query:NAME
# ca_file = "ca.pem"                  # trust only this CA bundle
# proxy = "http://127.0.0.1:3128"   # CONNECT tunnel (http:// url: trust_forward_proxy)
follow_redirects = false
# redirect_origins = ["https://files.example.com"]  # other origins a redirect may reach
max_body = 1048576                    # request body limit, bytes
# max_result = 1073741824             # response limit, bytes: past it, unknown (RESULT_SIZE_LIMIT)
budget = 3                            # attempts per invocation, recorded in the journal
timeout = { connect = 5, total = 30 }
# Only if the service documents key-based deduplication:
# idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }
# Risky methods wait for an operator's yes (needs [service] operator_uids; docs/approvals.md):
# approval = { methods = ["POST"], ttl = "15m", wait = "0s" }
# How `affidavit reconcile ID --query` settles an unknown outcome (docs/approvals.md):
# [targets.example.reconcile]
# path = "/charges?idempotency_key={idempotency_key}"
# committed_if = ["status:200", "json:/idempotency_key={idempotency_key}"]  # echoes this key
# rejected_if = ["status:404", "json:/error/code=resource_missing"]  # the API's own not-found
# settle = "60s"                      # "absent" is believed this long after the attempt ended

# An SSH target.  Pin the host key (replace this placeholder with the real one, e.g. from
# `ssh-keyscan -t ed25519 HOST`, without the host name it starts with) or point known_hosts
# at a file.
[targets.deploy]
kind = "ssh"
host = "127.0.0.1"
port = 22
user = "deploy"
host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
# known_hosts = "known_hosts"
credential = "vault:deploy_key"       # an OpenSSH private key stored in the vault
idempotent_commands = []              # exact commands known to be safe to repeat (never with stdin)
# approval = { except_commands = ["uptime"] }   # every command waits for an operator's yes
#   but these (simple: no `;`, `$`, quotes, tabs..., and without stdin), or "always"; a list of
#   what waits, { commands = ["^deploy "] }, is a convenience, never a boundary (logged)
timeout = { connect = 10, total = 600 }
# [targets.deploy.reconcile]
# command = "test -e /srv/releases/{idempotency_key}"
# committed_if = "exit:0"
# rejected_if = "exit:1"
"""


_SHARED = """\
[journal]
url = "{url}"  # a shared journal: several brokers on one database
key_file = "affidavit.key"          # the sealing key: copy the same file to every broker
signing_key = "affidavit.signing.key"  # this broker's own signing key (one per broker)
# auditor_public_key = "auditor.pub"  # from `affidavit journal audit-keygen` on the auditor's host
"""


def sample_config(journal_url: str | None = None) -> str:
    """The commented sample ``affidavit init`` writes.  It loads cleanly (tested).
    ``journal_url``: a shared PostgreSQL journal instead of the SQLite file."""
    if journal_url is None:
        return _SAMPLE
    start = _SAMPLE.index("[journal]")
    end = _SAMPLE.index("[vault]")
    return _SAMPLE[:start] + _SHARED.format(url=journal_url) + "\n" + _SAMPLE[end:]


def write_config(path: Path, text: str, *, replace: bool = False) -> None:
    """Write a config the broker generated (``affidavit init``, the demo's): a new file 0600
    from its first byte, whatever the umask -- under a umask of 002 (many desktops' default) it
    would be group-writable, which the broker refuses (CONFIG_EXPOSED), and a journal URL in it
    may carry a password.  Through ``write_private_file``: whole or not at all, and never
    through a link at ``path`` -- a name already there (a dangling link another user planted
    included) is ``FileExistsError``; ``replace`` (``init --force``) renames the new file over
    it, the link itself and never the file it names (which stays as it was); a regular file's
    owner, group, access ACL and mode less group and others' write are kept (``keep``:
    ``root:affidavit 0640`` stays so, for the daemon to read; ``OwnerNotKept``, nothing
    written, when this user cannot).  ``OSError`` as the write raises it."""
    write_private_file(path, text.encode("utf-8"), replace=replace, keep=replace)
