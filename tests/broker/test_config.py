# ruff: noqa: E501  (the error tables read best as one case per line)
"""Config loading: every field validated with a stable field path, paths resolved against the
config file's directory, and the target snapshot the engine binds (seed, "Validation and
credential injection finish before dispatch": "bind the normalized target ... If any bound value
changes, create a new invocation")."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import re
import struct
from pathlib import Path
from typing import Any

import pytest

from affidavit.adapters.ssh.known_hosts import known_host_keys
from affidavit.config import (
    CONFIG_ENV,
    ConfigError,
    Timeouts,
    config_path,
    load_config,
    parse_duration,
    result_limit,
    sample_config,
    snapshot,
    snapshot_hash,
)
from affidavit.protocols.http import HttpTarget, IdempotencyContract
from affidavit.protocols.http.batch import BatchContract
from affidavit.protocols.http.operations import OperationsContract
from affidavit.protocols.http.reconcile import ReconcileQuery as HttpReconcile
from affidavit.protocols.http.segments import BAD_PERCENT
from affidavit.protocols.http.selectors import Selector
from affidavit.protocols.placeholders import parse_template
from affidavit.protocols.ssh import SshTarget
from affidavit.protocols.ssh.reconcile import ReconcileCommand as SshReconcile
from affidavit.schema import ApprovalPolicy


def _key(kind: str = "ssh-ed25519", fill: int = 0) -> str:
    blob = struct.pack(">I", len(kind)) + kind.encode() + struct.pack(">I", 32) + bytes([fill]) * 32
    return f"{kind} {base64.b64encode(blob).decode()}"


KEY_A, KEY_B = _key(fill=1), _key(fill=2)

BASE = f"""
[journal]
path = "j/affidavit.db"

[vault]
path = "secrets.vault"

[targets.billing]
kind = "http"
url = "https://billing.example.com"
methods = ["GET", "POST"]
idempotent = ["GET", "PUT", "DELETE"]
credential = "env:BILLING_TOKEN"
inject = "bearer"
ca_file = "ca.pem"
proxy = "http://127.0.0.1:3128"
follow_redirects = false
max_body = 1048576
budget = 3
timeout = {{ connect = 5, total = 30 }}
idempotency = {{ header = "Idempotency-Key", scope = "payments.create", retention = "24h" }}

[targets.deploy]
kind = "ssh"
host = "127.0.0.1"
port = 22
user = "deploy"
host_key = "{KEY_A}"
credential = "vault:deploy_key"
idempotent_commands = []
timeout = {{ connect = 10, total = 600 }}
"""


def write(tmp_path: Path, text: str, name: str = "affidavit.toml") -> Path:
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    p = tmp_path / name
    p.write_text(text)
    return p


def load(tmp_path: Path, text: str) -> Any:
    return load_config(write(tmp_path, text))


def error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return info.value


def test_the_brief_example_loads_with_every_field_normalized(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    billing = config.targets["billing"]
    assert isinstance(billing, HttpTarget)
    assert billing.url == "https://billing.example.com"
    assert billing.origin == "https://billing.example.com:443"
    assert (billing.scheme, billing.host, billing.port) == ("https", "billing.example.com", 443)
    assert billing.base_path == ""
    assert billing.methods == {"GET", "POST"}
    assert billing.idempotent == {"GET", "PUT", "DELETE"}
    assert billing.credential == "env:BILLING_TOKEN"
    assert billing.ca_file == tmp_path / "ca.pem"
    assert billing.proxy == "http://127.0.0.1:3128"
    assert billing.timeout == Timeouts(5.0, 30.0)
    assert billing.idempotency == IdempotencyContract("Idempotency-Key", "payments.create", 86400)
    deploy = config.targets["deploy"]
    assert isinstance(deploy, SshTarget)
    assert deploy.host_keys == (KEY_A,)
    assert deploy.port == 22
    assert deploy.max_stdin == 1024 * 1024
    assert config.vault_path == tmp_path / "secrets.vault"


def test_sample_config_loads_cleanly(tmp_path: Path) -> None:
    config = load(tmp_path, sample_config())
    assert set(config.targets) == {"example", "deploy"}
    # The sample must not claim idempotency beyond what it documents.
    assert config.targets["example"].idempotent == {"GET"}


def test_defaults(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        """
[targets.t]
kind = "http"
url = "http://api.local:8080/base/"
trust_cleartext = true
methods = ["get"]
credential = "env:T"
""",
    )
    t = config.targets["t"]
    assert t.url == "http://api.local:8080/base"
    assert t.origin == "http://api.local:8080"
    assert t.base_path == "/base"
    assert t.methods == {"GET"}
    assert t.idempotent == frozenset()
    assert (t.inject, t.follow_redirects, t.budget, t.max_body) == ("bearer", False, 3, 1 << 20)
    assert t.idempotency is None and t.proxy is None and t.ca_file is None
    # An unset max_result is the 1 GiB default and stays out of the snapshot: targets written
    # before the setting existed keep their binding.
    assert t.max_result is None and result_limit(t) == 1 << 30
    assert "max_result" not in snapshot(t)
    assert snapshot(dataclasses.replace(t, max_result=1 << 30))["max_result"] == 1 << 30
    assert config.vault_path is None
    assert config.journal.path == tmp_path / "affidavit.db"
    assert config.journal.key_file == tmp_path / "affidavit.db.key"
    assert config.journal.auditor_public_key is None


def test_relative_paths_resolve_against_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    (conf_dir / "auditor.pub").write_text("pk")
    (conf_dir / "known_hosts").write_text(f"10.0.0.5 {KEY_B}\n")
    path = write(
        conf_dir,
        """
[journal]
path = "data/j.db"
key_file = "keys/j.key"
auditor_public_key = "auditor.pub"
[vault]
path = "v/secrets.vault"
[targets.h]
kind = "http"
url = "https://h.example"
methods = ["GET"]
credential = "file:tokens/h"
ca_file = "ca.pem"
[targets.s]
kind = "ssh"
host = "10.0.0.5"
user = "u"
known_hosts = "known_hosts"
credential = "file:/abs/key"
""",
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(path)
    assert config.path == path
    assert config.journal.path == conf_dir / "data/j.db"
    assert config.journal.key_file == conf_dir / "keys/j.key"
    assert config.journal.auditor_public_key == conf_dir / "auditor.pub"
    assert config.vault_path == conf_dir / "v/secrets.vault"
    assert config.targets["h"].ca_file == conf_dir / "ca.pem"
    assert config.targets["h"].credential == f"file:{conf_dir / 'tokens/h'}"
    assert config.targets["s"].credential == "file:/abs/key"
    assert config.targets["s"].host_keys == (KEY_B,)
    # a relative --config path is resolved from the cwd, then its directory is the base
    monkeypatch.chdir(tmp_path)
    again = load_config("etc/affidavit.toml")
    assert again.journal.path == conf_dir / "data/j.db"


def test_config_path_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, "/from/env.toml")
    assert config_path("/explicit.toml") == Path("/explicit.toml")
    assert config_path(None) == Path("/from/env.toml")
    monkeypatch.delenv(CONFIG_ENV)
    monkeypatch.chdir(tmp_path)
    assert config_path(None) == tmp_path / "affidavit.toml"  # absolute, as messages name it
    assert config_path("etc/a.toml") == tmp_path / "etc/a.toml"
    write(tmp_path, sample_config())
    assert set(load_config().targets) == {"example", "deploy"}


def test_missing_file_and_bad_toml_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: config file not found " + (
        "(create one with `affidavit init`)"
    )
    err = error(tmp_path, "[targets\nkind=")
    assert str(err).startswith(f"{tmp_path / 'affidavit.toml'}: invalid TOML")
    assert "\n" not in str(err)
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(p)


def test_every_config_error_names_the_file_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named relatively (``--config affidavit.toml``, the default), a TOML or UTF-8 error
    named the file as given while a field's error named it absolutely: the same file, two
    names in one log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "affidavit.toml").write_text("[targets\nkind=")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    (tmp_path / "field.toml").write_text("[targets.api]\nkind = 7\n")
    for name in ("affidavit.toml", "bin.toml", "field.toml", "nope.toml"):
        with pytest.raises(ConfigError) as info:
            load_config(name)
        assert str(info.value).startswith(f"{tmp_path / name}: "), info.value


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


HTTP_LINE_ERRORS = [
    # (old line, new line, field path)
    ('kind = "http"', 'kind = "ftp"', "targets.billing.kind"),
    ('kind = "http"', "", "targets.billing.kind"),
    ('url = "https://billing.example.com"', "", "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "ftp://x"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://u:p@x.com"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://x.com/?q=1"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://x.com/#f"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://x.com/a/../b"', "targets.billing.url"),
    # the base path is checked as an action's path is (segments.py): padded, double-encoded,
    # overlong and full-width dot segments are ways out of it too
    (
        'url = "https://billing.example.com"',
        'url = "https://x.com/a/..%20/b"',
        "targets.billing.url",
    ),
    (
        'url = "https://billing.example.com"',
        'url = "https://x.com/%252e%252e"',
        "targets.billing.url",
    ),
    (
        'url = "https://billing.example.com"',
        'url = "https://x.com/%C0%AE%C0%AE"',
        "targets.billing.url",
    ),
    (
        'url = "https://billing.example.com"',
        'url = "https://x.com/%EF%BC%8E"',
        "targets.billing.url",
    ),
    (
        'url = "https://billing.example.com"',
        'url = "https://x.com/..%3F"',  # a decoded "?" ends the name (segments.py)
        "targets.billing.url",
    ),
    (
        'url = "https://billing.example.com"',
        'url = "https://x.com/%EF%BC%85%EF%BC%92%EF%BD%85"',  # "％２ｅ": "%2e" to NFKC
        "targets.billing.url",
    ),
    ('url = "https://billing.example.com"', 'url = "https://x.com/a b"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://x.com:99999"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://"', "targets.billing.url"),
    ('url = "https://billing.example.com"', 'url = "https://bad_host!/"', "targets.billing.url"),
    ('url = "https://billing.example.com"', "url = 5", "targets.billing.url"),
    ('methods = ["GET", "POST"]', "methods = []", "targets.billing.methods"),
    ('methods = ["GET", "POST"]', "", "targets.billing.methods"),
    ('methods = ["GET", "POST"]', 'methods = "GET"', "targets.billing.methods"),
    ('methods = ["GET", "POST"]', 'methods = ["GET", "P OST"]', "targets.billing.methods[1]"),
    ('methods = ["GET", "POST"]', 'methods = ["GET", 1]', "targets.billing.methods[1]"),
    # CONNECT asks for a tunnel, which the HTTP adapter cannot carry (audit 48b #4).
    ('methods = ["GET", "POST"]', 'methods = ["GET", "connect"]', "targets.billing.methods[1]"),
    (
        'idempotent = ["GET", "PUT", "DELETE"]',
        'idempotent = ["CONNECT", "GET"]',
        "targets.billing.idempotent[0]",
    ),
    # TRACE's answer is the request as received, credential and all (RFC 9110 §9.3.8).
    ('methods = ["GET", "POST"]', 'methods = ["GET", "Trace"]', "targets.billing.methods[1]"),
    (
        'idempotent = ["GET", "PUT", "DELETE"]',
        'idempotent = ["GET", "TRACE"]',
        "targets.billing.idempotent[1]",
    ),
    (
        'idempotent = ["GET", "PUT", "DELETE"]',
        'idempotent = ["G/T"]',
        "targets.billing.idempotent[0]",
    ),
    ('credential = "env:BILLING_TOKEN"', "", "targets.billing.credential"),
    ('credential = "env:BILLING_TOKEN"', 'credential = "BILLING"', "targets.billing.credential"),
    ('credential = "env:BILLING_TOKEN"', 'credential = "env:1BAD"', "targets.billing.credential"),
    ('inject = "bearer"', 'inject = "cookie"', "targets.billing.inject"),
    ('inject = "bearer"', 'inject = "header:Bad Name"', "targets.billing.inject"),
    ('inject = "bearer"', 'inject = "header:Host"', "targets.billing.inject"),
    ('inject = "bearer"', 'inject = "query:a&b"', "targets.billing.inject"),
    ('ca_file = "ca.pem"', 'ca_file = "missing.pem"', "targets.billing.ca_file"),
    ('proxy = "http://127.0.0.1:3128"', 'proxy = "http://u:p@proxy:3128"', "targets.billing.proxy"),
    (
        'proxy = "http://127.0.0.1:3128"',
        'proxy = "http://proxy:3128/path"',
        "targets.billing.proxy",
    ),
    ('proxy = "http://127.0.0.1:3128"', 'proxy = "socks5://proxy:1080"', "targets.billing.proxy"),
    ("follow_redirects = false", 'follow_redirects = "no"', "targets.billing.follow_redirects"),
    ("max_body = 1048576", "max_body = -1", "targets.billing.max_body"),
    ("max_body = 1048576", "max_body = 1.5", "targets.billing.max_body"),
    ("max_body = 1048576", "max_body = true", "targets.billing.max_body"),
    ("max_body = 1048576", "max_body = 1048576\nmax_result = 0", "targets.billing.max_result"),
    ("max_body = 1048576", 'max_body = 1048576\nmax_result = "1GiB"', "targets.billing.max_result"),
    ("budget = 3", "budget = 0", "targets.billing.budget"),
    ("budget = 3", "budget = 1000", "targets.billing.budget"),
    ("budget = 3", "budget = true", "targets.billing.budget"),
    (
        "timeout = { connect = 5, total = 30 }",
        "timeout = { connect = 50, total = 30 }",
        "targets.billing.timeout.connect",
    ),
    (
        "timeout = { connect = 5, total = 30 }",
        "timeout = { connect = 5, total = -1 }",
        "targets.billing.timeout.total",
    ),
    (
        "timeout = { connect = 5, total = 30 }",
        'timeout = { connect = "5s" }',
        "targets.billing.timeout.connect",
    ),
    (
        "timeout = { connect = 5, total = 30 }",
        "timeout = { connect = 5, read = 3 }",
        "targets.billing.timeout.read",
    ),
    ("timeout = { connect = 5, total = 30 }", "timeout = 5", "targets.billing.timeout"),
    (
        'idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }',
        'idempotency = { header = "Authorization", scope = "s", retention = "24h" }',
        "targets.billing.idempotency.header",
    ),
    (
        'idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }',
        'idempotency = { header = "Idempotency-Key", retention = "24h" }',
        "targets.billing.idempotency.scope",
    ),
    (
        'idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }',
        'idempotency = { header = "Idempotency-Key", scope = "s", retention = "soon" }',
        "targets.billing.idempotency.retention",
    ),
    (
        'idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }',
        'idempotency = { header = "Idempotency-Key", scope = "s" }',
        "targets.billing.idempotency.retention",
    ),
    (
        'idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }',
        'idempotency = { header = "Idempotency-Key", scope = "s", retention = "1h", x = 1 }',
        "targets.billing.idempotency.x",
    ),
    ("budget = 3", "budget = 3\nmethod = ['GET']", "targets.billing.method"),
    ("budget = 3", "budget = 3\nhost = 'x'", "targets.billing.host"),
]


@pytest.mark.parametrize(("old", "new", "field"), HTTP_LINE_ERRORS)
def test_every_http_field_is_validated_with_its_path(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    err = error(tmp_path, _replace(BASE, old, new))
    assert err.field == field
    assert str(err) == f"{tmp_path / 'affidavit.toml'}: {field}: {err.message}"
    _names_its_field_once(err)


def test_a_base_path_percent_that_is_no_escape_is_refused_with_the_one_message(
    tmp_path: Path,
) -> None:
    """IIS reads ``%u002e`` as "."; the base path is held to the action path's check."""
    err = error(
        tmp_path,
        _replace(BASE, 'url = "https://billing.example.com"', 'url = "https://x.com/%u002e"'),
    )
    assert (err.field, err.message) == ("targets.billing.url", f"base path {BAD_PERCENT}")


@pytest.mark.parametrize(
    ("method", "why"),
    [
        ("connect", "CONNECT opens a tunnel, which the broker cannot carry as a request"),
        ("TRACE", "TRACE would echo the injected credential back"),
    ],
)
@pytest.mark.parametrize("key", ["methods", "idempotent"])
def test_a_method_the_broker_will_not_send_is_refused_with_why(
    tmp_path: Path, method: str, why: str, key: str
) -> None:
    old = {
        "methods": 'methods = ["GET", "POST"]',
        "idempotent": 'idempotent = ["GET", "PUT", "DELETE"]',
    }
    err = error(tmp_path, _replace(BASE, old[key], f'{key} = ["GET", "{method}"]'))
    assert (err.code, err.field) == ("CONFIG_INVALID", f"targets.billing.{key}[1]")
    assert err.message.startswith(why), err.message


def _names_its_field_once(err: ConfigError) -> None:
    """The path names the setting: its message does not start with the name again
    (``targets.billing.url: url must start with ...``, ``... credential: credential reference
    must be ...`` read it twice)."""
    name = re.sub(r"\[\d+\]$", "", err.field).rsplit(".", 1)[-1]
    assert not re.match(rf"{re.escape(name)}\b", err.message), str(err)


SSH_LINE_ERRORS = [
    ('host = "127.0.0.1"', "", "targets.deploy.host"),
    ('host = "127.0.0.1"', 'host = "user@host"', "targets.deploy.host"),
    ('host = "127.0.0.1"', 'host = "a b"', "targets.deploy.host"),
    ("port = 22", "port = 0", "targets.deploy.port"),
    ("port = 22", "port = 70000", "targets.deploy.port"),
    ("port = 22", 'port = "22"', "targets.deploy.port"),
    ('user = "deploy"', "", "targets.deploy.user"),
    ('user = "deploy"', 'user = "de ploy"', "targets.deploy.user"),
    (f'host_key = "{KEY_A}"', "", "targets.deploy.host_key"),
    (f'host_key = "{KEY_A}"', 'host_key = "ssh-ed25519"', "targets.deploy.host_key"),
    (f'host_key = "{KEY_A}"', 'host_key = "ssh-dss AAAA"', "targets.deploy.host_key"),
    (f'host_key = "{KEY_A}"', 'host_key = "ssh-ed25519 !!!"', "targets.deploy.host_key"),
    (
        f'host_key = "{KEY_A}"',
        f'host_key = "{_key("ssh-ed25519")[:12]}{_key("ssh-rsa")[7:]}"',
        "targets.deploy.host_key",
    ),
    (f'host_key = "{KEY_A}"', f'host_key = ["{KEY_A}", "junk"]', "targets.deploy.host_key[1]"),
    (f'host_key = "{KEY_A}"', "host_key = []", "targets.deploy.host_key"),
    (
        f'host_key = "{KEY_A}"',
        f'host_key = "{KEY_A}"\nknown_hosts = "kh"',
        "targets.deploy.host_key",
    ),
    (f'host_key = "{KEY_A}"', 'known_hosts = "missing_kh"', "targets.deploy.known_hosts"),
    (
        'credential = "vault:deploy_key"',
        'credential = "vault:bad/name"',
        "targets.deploy.credential",
    ),
    (
        "idempotent_commands = []",
        'idempotent_commands = "ls"',
        "targets.deploy.idempotent_commands",
    ),
    (
        "idempotent_commands = []",
        'idempotent_commands = ["ls\\nrm -rf /"]',
        "targets.deploy.idempotent_commands[0]",
    ),
    ("idempotent_commands = []", "max_stdin = -5", "targets.deploy.max_stdin"),
    ("idempotent_commands = []", "max_result = -1", "targets.deploy.max_result"),
    ("idempotent_commands = []", 'url = "https://x"', "targets.deploy.url"),
]


@pytest.mark.parametrize(("old", "new", "field"), SSH_LINE_ERRORS)
def test_every_ssh_field_is_validated_with_its_path(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    err = error(tmp_path, _replace(BASE, old, new))
    assert err.field == field
    _names_its_field_once(err)


def test_a_pasted_ssh_keyscan_line_says_to_drop_the_host_name(tmp_path: Path) -> None:
    """The sample config suggests ``ssh-keyscan -t ed25519 HOST``, whose line starts with the
    host: pasted whole, the error says so instead of calling the host an unknown key type."""
    err = error(tmp_path, _replace(BASE, f'host_key = "{KEY_A}"', f'host_key = "10.0.0.7 {KEY_A}"'))
    assert err.field == "targets.deploy.host_key"
    assert "without the host name" in err.message and "unsupported key type" not in err.message


TOP_ERRORS = [
    ('[journal]\npath = "j/affidavit.db"', '[journal]\npath = ""', "journal.path"),
    ('[journal]\npath = "j/affidavit.db"', "[journal]\npath = 3", "journal.path"),
    ('[journal]\npath = "j/affidavit.db"', '[journal]\nkeyfile = "k"', "journal.keyfile"),
    (
        '[journal]\npath = "j/affidavit.db"',
        '[journal]\nauditor_public_key = "missing.pub"',
        "journal.auditor_public_key",
    ),
    ('[vault]\npath = "secrets.vault"', '[vault]\nfile = "x"', "vault.file"),
    ('[vault]\npath = "secrets.vault"', "", "targets.deploy.credential"),
    ("[targets.billing]", "[targets.bad!name]", None),
    ("[journal]", "[nonsense]\nx = 1\n[journal]", "nonsense"),
]


@pytest.mark.parametrize(("old", "new", "field"), TOP_ERRORS)
def test_top_level_sections_are_validated(
    tmp_path: Path, old: str, new: str, field: str | None
) -> None:
    text = _replace(BASE, old, new)
    if "bad!name" in new:
        text = text.replace("[targets.bad!name]", '[targets."bad!name"]')
        field = "targets.bad!name"
    assert error(tmp_path, text).field == field


def test_a_mistyped_credential_ref_is_never_echoed(tmp_path: Path) -> None:
    canary = "ghp_CANARYc0ffee1234567890"
    text = _replace(BASE, 'credential = "env:BILLING_TOKEN"', f'credential = "{canary}"')
    err = error(tmp_path, text)
    assert err.field == "targets.billing.credential"
    assert canary not in str(err) and canary not in repr(err)


def test_ca_file_needs_https(tmp_path: Path) -> None:
    text = _replace(BASE, 'url = "https://billing.example.com"', 'url = "http://billing.example"')
    assert error(tmp_path, text).field == "targets.billing.ca_file"


def test_idempotency_header_may_not_be_the_injected_header(tmp_path: Path) -> None:
    text = _replace(BASE, 'inject = "bearer"', 'inject = "header:Idempotency-Key"')
    assert error(tmp_path, text).field == "targets.billing.idempotency.header"


@pytest.mark.parametrize(
    ("url", "normalized", "origin", "base"),
    [
        ("HTTPS://Billing.Example.COM:443/Api/V1/", "https://billing.example.com/Api/V1",
         "https://billing.example.com:443", "/Api/V1"),
        ("http://127.0.0.1:80", "http://127.0.0.1", "http://127.0.0.1:80", ""),
        ("https://example.com:8443//a//b", "https://example.com:8443/a/b",
         "https://example.com:8443", "/a/b"),
        ("http://[::1]:8080/x", "http://[::1]:8080/x", "http://[::1]:8080", "/x"),
        ("https://127.0.0.1", "https://127.0.0.1", "https://127.0.0.1:443", ""),
        ("https://xn--bcher-kva.example", "https://xn--bcher-kva.example",
         "https://xn--bcher-kva.example:443", ""),
    ],
)  # fmt: skip
def test_urls_are_normalized(
    tmp_path: Path, url: str, normalized: str, origin: str, base: str
) -> None:
    text = _replace(BASE, 'ca_file = "ca.pem"\n', "")  # ca_file needs https
    # and an http:// url's proxy is a forward proxy, which needs trust_forward_proxy
    text = _replace(text, 'proxy = "http://127.0.0.1:3128"\n', "")
    text = _replace(text, 'url = "https://billing.example.com"', f'url = "{url}"')
    t = load(tmp_path, text).targets["billing"]
    assert (t.url, t.origin, t.base_path) == (normalized, origin, base)


def test_ipv6_origin_properties(tmp_path: Path) -> None:
    text = _replace(BASE, 'url = "https://billing.example.com"', 'url = "https://[::1]:9443"')
    t = load(tmp_path, text).targets["billing"]
    assert (t.scheme, t.host, t.port) == ("https", "::1", 9443)


def test_host_key_list_allows_rotation(tmp_path: Path) -> None:
    text = _replace(BASE, f'host_key = "{KEY_A}"', f'host_key = ["{KEY_B} new", "{KEY_A}"]')
    assert load(tmp_path, text).targets["deploy"].host_keys == tuple(sorted((KEY_A, KEY_B)))


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("24h", 86400.0), ("90m", 5400.0), ("1h30m", 5400.0), ("7d", 604800.0), (45, 45.0),
     ("2.5s", 2.5), (0.5, 0.5), ("36500d", 36500 * 86400.0)],
)  # fmt: skip
def test_parse_duration(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    "value",
    ["", "h", "10", "10x", "-1h", 0, -3, True, None, "1h 2x", "36501d", "999999999d", 1e20],
)
def test_parse_duration_rejects(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


# --- known_hosts ------------------------------------------------------------------------------


def _hashed(name: str) -> str:
    salt = b"0123456789abcdefghij"
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


def test_known_hosts_matching() -> None:
    key_c, key_d, key_e = _key(fill=3), _key(fill=4), _key("ecdsa-sha2-nistp256", 5)
    text = "\n".join(
        [
            "# comment",
            "",
            f"other.example {KEY_A}",
            f"db.example,10.0.0.1 {KEY_B} comment here",
            f"{_hashed('db.example')} {key_c}",
            f"[db.example]:2222 {key_d}",
            f"*.wild.example,!bad.wild.example {key_e}",
            f"@cert-authority db.example {_key(fill=9)}",
            f"@revoked * {_key(fill=8)}",
            f"db.example {_key(fill=8)}",
            "db.example ssh-ed25519 not-base64!",
            "garbage",
        ]
    )
    assert known_host_keys(text, "db.example", 22) == tuple(sorted((KEY_B, key_c)))
    assert known_host_keys(text, "10.0.0.1", 22) == (KEY_B,)
    assert known_host_keys(text, "db.example", 2222) == (key_d,)
    assert known_host_keys(text, "a.wild.example", 22) == (key_e,)
    assert known_host_keys(text, "bad.wild.example", 22) == ()
    # ssh lowercases the host before matching and hashing: a hashed entry matches too
    assert known_host_keys(text, "DB.EXAMPLE", 22) == tuple(sorted((KEY_B, key_c)))


def test_known_hosts_without_a_key_for_the_host_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "kh").write_text(f"elsewhere {KEY_A}\n")
    text = _replace(BASE, f'host_key = "{KEY_A}"', 'known_hosts = "kh"')
    err = error(tmp_path, text)
    assert err.field == "targets.deploy.known_hosts"
    assert "no usable key" in err.message


# --- snapshot ---------------------------------------------------------------------------------


def test_snapshot_is_stable_canonical_and_json(tmp_path: Path) -> None:
    a = load(tmp_path, BASE)
    reordered = BASE.replace(
        'methods = ["GET", "POST"]', 'methods = ["POST", "GET", "post"]'
    ).replace("timeout = { connect = 5, total = 30 }", "timeout = { total = 30.0, connect = 5.0 }")
    b = load(tmp_path, reordered)
    for name in ("billing", "deploy"):
        assert snapshot(a.targets[name]) == snapshot(b.targets[name])
        assert snapshot_hash(a.targets[name]) == snapshot_hash(b.targets[name])
        assert snapshot_hash(a.targets[name]).startswith("sha256:")
        json.dumps(snapshot(a.targets[name]), allow_nan=False)
    assert snapshot_hash(a.targets["billing"]) != snapshot_hash(a.targets["deploy"])


def test_snapshot_holds_no_secret_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    canary = "CANARY-snapshot-5ecret"
    monkeypatch.setenv("BILLING_TOKEN", canary)
    config = load(tmp_path, BASE)
    for target in config.targets.values():
        assert canary not in json.dumps(snapshot(target))


HTTP_CHANGES: dict[str, object] = {
    "name": "billing2",
    "url": "https://billing.example.com/v2",
    "origin": "https://billing.example.com:8443",
    "base_path": "/v2",
    "methods": frozenset({"GET"}),
    "idempotent": frozenset({"GET"}),
    "credential": "env:OTHER",
    "inject": "basic",
    "ca_file": Path("/other/ca.pem"),
    "proxy": None,
    "trust_forward_proxy": True,
    "trust_cleartext": True,
    "escaped_query_values": True,
    "follow_redirects": True,
    "redirect_origins": frozenset({"https://files.example.com:443"}),
    "max_body": 10,
    "max_result": 1 << 20,
    "budget": 1,
    "timeout": Timeouts(5.0, 31.0),
    "idempotency": IdempotencyContract("Idempotency-Key", "payments.create", 3600.0),
    "operations": OperationsContract(
        Selector("json", "/id"),
        Selector("header", "Location"),
        Selector("json", "/status"),
        frozenset({"done"}),
        frozenset({"failed"}),
    ),
    "batch": BatchContract(
        Selector("json", "/results"),
        Selector("json", "/items"),
        None,
        Selector("json", "/status"),
        (200,),
        (),
        False,
    ),
    "approval": ApprovalPolicy(frozenset({"POST"}), None, 900.0, 0.0),
    "reconcile": HttpReconcile(
        "GET", parse_template("/v1/c?k={idempotency_key}", shell=False), None, None, 60.0
    ),
}
SSH_CHANGES: dict[str, object] = {
    "name": "deploy2",
    "host": "127.0.0.2",
    "port": 2222,
    "user": "root",
    "host_keys": (KEY_B,),
    "credential": "vault:other",
    "idempotent_commands": frozenset({"uptime"}),
    "budget": 9,
    "timeout": Timeouts(1.0, 600.0),
    "max_stdin": 5,
    "max_result": 4096,
    "approval": ApprovalPolicy(None, ("^deploy ",), 900.0, 0.0),
    "reconcile": SshReconcile(
        parse_template("test -e /r/{idempotency_key}", shell=True), 0, 1, 60.0
    ),
    "auth": "password",
}


def test_every_bound_value_changes_the_snapshot_hash(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    for name, changes in (("billing", HTTP_CHANGES), ("deploy", SSH_CHANGES)):
        target = config.targets[name]
        # A field added to the dataclass without a snapshot entry (and a case here) fails this.
        # Save SSH's ``known_hosts`` path: the keys read from it (``host_keys``) bind, the path
        # is kept only for the start's exposure check (``Field.trust_anchor``).
        unbound = {"known_hosts"} if name == "deploy" else set()
        assert set(changes) == {f.name for f in dataclasses.fields(target)} - {"kind"} - unbound
        base = snapshot_hash(target)
        for field, value in changes.items():
            changed = dataclasses.replace(target, **{field: value})  # type: ignore[arg-type]
            assert snapshot_hash(changed) != base, field
        for field in unbound:
            moved = dataclasses.replace(target, **{field: tmp_path / "elsewhere"})  # type: ignore[arg-type]
            assert snapshot_hash(moved) == base, field


def test_error_str_without_file() -> None:
    assert (
        str(ConfigError("targets.x.url", "is required")) == "<config>: targets.x.url: is required"
    )
    assert str(ConfigError("", "boom", "/a.toml")) == "/a.toml: boom"


def test_env_var_file_is_used_when_no_explicit_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, BASE, "custom.toml")
    monkeypatch.setenv(CONFIG_ENV, os.fspath(path))
    monkeypatch.chdir("/")
    assert load_config().path == path


def test_redirect_origins_are_normalized_and_need_follow_redirects(tmp_path: Path) -> None:
    text = BASE.replace(
        "follow_redirects = false",
        'follow_redirects = true\nredirect_origins = ["HTTPS://Files.Example.com", "http://[::1]:8080/"]'
        # reached through the target's proxy as a forward proxy
        "\ntrust_forward_proxy = true",
    )
    target = load(tmp_path, text).targets["billing"]
    assert target.redirect_origins == frozenset(
        {"https://files.example.com:443", "http://[::1]:8080"}
    )
    bad_path = BASE.replace(
        "follow_redirects = false",
        'follow_redirects = true\nredirect_origins = ["https://files.example.com/x"]',
    )
    with pytest.raises(ConfigError) as info:
        load(tmp_path, bad_path)
    assert info.value.field == "targets.billing.redirect_origins[0]"
    without_follow = BASE.replace(
        "follow_redirects = false",
        'follow_redirects = false\nredirect_origins = ["https://files.example.com"]',
    )
    with pytest.raises(ConfigError) as info:
        load(tmp_path, without_follow)
    assert info.value.field == "targets.billing.redirect_origins"


def test_a_config_named_from_a_removed_working_directory_is_not_found_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(ConfigError) as info:
        load_config("affidavit.toml")
    assert info.value.code == "CONFIG_NOT_FOUND", info.value
    assert str(info.value).startswith("affidavit.toml: config file not found"), info.value
