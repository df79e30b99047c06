"""``affidavit.toml``: loading, validation, and the target snapshot the engine binds.

Seed, "Validation and credential injection finish before dispatch": "If validation used one route
definition and an already modified one was read before dispatch, the evidence does not describe
the action that was actually performed.  Before approval, bind the normalized target, the
credential version, the resolved injection method, and the request fingerprint to the
invocation."  So a target is loaded once into a frozen, normalized value; ``snapshot()`` is its
canonical, secret-free description and ``snapshot_hash()`` the digest the engine records and
re-checks before the write.  Any change to a bound value changes the hash.

Every problem is a ``ConfigError`` naming the file, the field path to fix
(``targets.billing.inject``) and why — never a traceback.  Unknown settings are errors too: a
misspelt ``idempotent`` silently ignored would make the broker retry (or refuse to retry) on a
guess.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import math
import os
import re
import struct
import tomllib
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from affidavit.adapters.ssh.known_hosts import known_host_keys
from affidavit.secrets.credentials import CredentialError, parse_inject, parse_ref

__all__ = [
    "CONFIG_ENV",
    "Config",
    "ConfigError",
    "HttpTarget",
    "IdempotencyContract",
    "JournalConfig",
    "SshTarget",
    "Target",
    "Timeouts",
    "canonical_json",
    "config_from_dict",
    "config_path",
    "known_host_keys",
    "load_config",
    "origin_of",
    "parse_duration",
    "sample_config",
    "snapshot",
    "snapshot_hash",
]

CONFIG_ENV = "AFFIDAVIT_CONFIG"
DEFAULT_CONFIG = "affidavit.toml"
DEFAULT_MAX_BODY = 1024 * 1024
DEFAULT_MAX_STDIN = 1024 * 1024
DEFAULT_BUDGET = 3
DEFAULT_TIMEOUTS = (10.0, 60.0)
MAX_BUDGET = 100

# Headers a caller may never set and an idempotency contract may never name: credential-bearing
# ones the broker owns, and framing/routing ones the transport owns.
TRANSPORT_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer"}
)
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")
_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?")
_SSH_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@\-]{0,63}")
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)([dhms]))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
# RFC 3986 pchar + "/" (a base path carries no query or fragment)
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")
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


class ConfigError(Exception):
    """A configuration problem: ``str()`` is ``"<file>: <field>: <message>"``."""

    def __init__(self, field: str, message: str, file: str | Path | None = None) -> None:
        self.field = field
        self.message = message
        self.file = str(file) if file is not None else None
        super().__init__(field, message)

    def __str__(self) -> str:
        parts = [self.file or "<config>"]
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)


@dataclass(frozen=True)
class Timeouts:
    connect: float
    total: float


@dataclass(frozen=True)
class IdempotencyContract:
    """The target's documented deduplication contract (seed, "Idempotency is defined by the
    remote contract"): the header it reads, the scope it deduplicates in, how long it keeps keys."""

    header: str
    scope: str
    retention_s: float


@dataclass(frozen=True)
class HttpTarget:
    name: str
    url: str
    """Normalized: lower-case scheme and host, port only when not the default, base path."""
    origin: str
    """``scheme://host:port`` with the port always explicit (IPv6 hosts in brackets)."""
    base_path: str
    """``""`` or ``/segment...`` without a trailing slash; prefixed to every action path."""
    methods: frozenset[str]
    idempotent: frozenset[str]
    credential: str
    inject: str
    ca_file: Path | None
    proxy: str | None
    follow_redirects: bool
    redirect_origins: frozenset[str]
    """Other origins a followed redirect may go to (normalized ``scheme://host:port``), never
    with the credential.  Empty: only the target's own origin."""
    max_body: int
    budget: int
    timeout: Timeouts
    idempotency: IdempotencyContract | None
    kind: Literal["http"] = "http"

    @property
    def scheme(self) -> str:
        return self.origin.split("://", 1)[0]

    @property
    def host(self) -> str:
        """Host name or IP literal (IPv6 without brackets)."""
        hostport = self.origin.split("://", 1)[1]
        return hostport.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.origin.rsplit(":", 1)[1])


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
    max_stdin: int
    kind: Literal["ssh"] = "ssh"


Target = HttpTarget | SshTarget


@dataclass(frozen=True)
class JournalConfig:
    path: Path
    key_file: Path
    auditor_public_key: Path | None


@dataclass(frozen=True)
class Config:
    path: Path | None
    journal: JournalConfig
    vault_path: Path | None
    targets: Mapping[str, Target]


# --- locating and loading ---------------------------------------------------------------------


def config_path(explicit: str | None) -> Path:
    """``--config`` beats ``$AFFIDAVIT_CONFIG`` beats ``./affidavit.toml``."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    return Path(DEFAULT_CONFIG)


def load_config(path: str | Path | None = None) -> Config:
    """Read and validate a config file.  Relative paths inside resolve against its directory."""
    p = config_path(str(path) if path is not None else None)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            "", "config file not found (create one with `affidavit init`)", p
        ) from None
    except OSError as exc:
        raise ConfigError("", f"cannot read config file ({exc.strerror})", p) from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("", "config file is not UTF-8", p) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"invalid TOML: {exc}", p) from None
    absolute = Path(os.path.abspath(p))
    return config_from_dict(data, base_dir=absolute.parent, path=absolute)


def config_from_dict(
    data: Mapping[str, Any], *, base_dir: Path, path: Path | None = None
) -> Config:
    """Validate an already-parsed config (what ``load_config`` does after TOML parsing)."""
    try:
        return _Loader(Path(os.path.abspath(base_dir))).config(data, path)
    except ConfigError as exc:
        exc.file = str(path) if path is not None else None
        raise


# --- field readers ----------------------------------------------------------------------------

_MISSING: Any = object()


def _kind_of(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class _Table:
    """Reads one TOML table, tracking which keys were consumed so leftovers are errors."""

    def __init__(self, data: object, prefix: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(prefix, f"must be a table, not {_kind_of(data)}")
        self.data = data
        self.prefix = prefix
        self.seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, default: Any = _MISSING) -> Any:
        self.seen.add(key)
        if key in self.data:
            return self.data[key]
        if default is _MISSING:
            raise ConfigError(self.path(key), "is required")
        return default

    def has(self, key: str) -> bool:
        return key in self.data

    def string(self, key: str, default: Any = _MISSING, *, max_len: int = 4096) -> Any:
        value = self.get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise ConfigError(self.path(key), f"must be a string, not {_kind_of(value)}")
        if not value:
            raise ConfigError(self.path(key), "must not be empty")
        if len(value) > max_len:
            raise ConfigError(self.path(key), f"is longer than {max_len} characters")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ConfigError(self.path(key), "must not contain control characters")
        return value

    def integer(self, key: str, default: int, lo: int, hi: int) -> int:
        value = self.get(key, default)
        # bool is an int subclass in Python; `budget = true` is a mistake, not 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(self.path(key), f"must be an integer, not {_kind_of(value)}")
        if not lo <= value <= hi:
            raise ConfigError(self.path(key), f"must be between {lo} and {hi}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.path(key), f"must be true or false, not {_kind_of(value)}")
        return value

    def string_list(self, key: str, default: Any = _MISSING) -> list[str]:
        value = self.get(key, default)
        if not isinstance(value, list):
            raise ConfigError(self.path(key), f"must be an array of strings, not {_kind_of(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{self.path(key)}[{i}]", "must be a non-empty string")
            if any(c in item for c in "\r\n\x00"):
                raise ConfigError(f"{self.path(key)}[{i}]", "must not contain CR, LF or NUL")
        return value

    def finish(self, allowed_hint: str | None = None) -> None:
        for key in self.data:
            if key not in self.seen:
                hint = f" (allowed: {allowed_hint})" if allowed_hint else ""
                raise ConfigError(self.path(str(key)), f"unknown setting{hint}")


def parse_duration(value: object) -> float:
    """``"24h"``, ``"90m"``, ``"1h30m"``, ``"7d"``, ``"45s"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError('must be a duration like "24h" or a number of seconds')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        seconds = sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value))
    else:
        raise ValueError('must be a duration like "24h" or a number of seconds')
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError("must be a positive duration")
    return seconds


def _check_host(host: str) -> str:
    """Validate and normalize a host name or IP literal (lower-case, IDNA for names)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii") if not host.isascii() else host
    except UnicodeError:
        raise ValueError("is not a valid host name") from None
    if not _HOSTNAME.fullmatch(ascii_host):
        raise ValueError("is not a valid host name")
    return ascii_host.lower().rstrip(".")


def _host_for_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _parse_url(
    value: str, schemes: tuple[str, ...], what: str
) -> tuple[str, str, int, str, urllib.parse.SplitResult]:
    if any(c.isspace() for c in value):
        raise ValueError(f"{what} must not contain whitespace")
    parts = urllib.parse.urlsplit(value)
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise ValueError(f"{what} must start with " + " or ".join(f"{s}://" for s in schemes))
    if "@" in parts.netloc:
        # Credentials in a URL end up in logs, snapshots and journal rows.
        raise ValueError(f"{what} must not embed user:password; use `credential`")
    if not parts.hostname:
        raise ValueError(f"{what} has no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{what} has an invalid port") from None
    host = _check_host(parts.hostname)
    default = {"http": 80, "https": 443}[scheme]
    if port == 0:
        raise ValueError(f"{what} has an invalid port")
    return scheme, host, port or default, parts.path, parts


# --- known_hosts --------------------------------------------------------------------------------


def _check_host_key(line: str) -> str:
    """``"<type> <base64> [comment]"`` -> ``"<type> <base64>"`` after checking the blob's own
    type name matches (RFC 4253 §6.6: the blob starts with the key type string)."""
    fields = line.split()
    if len(fields) < 2:
        raise ValueError('must look like "ssh-ed25519 AAAA…"')
    key_type, b64 = fields[0], fields[1]
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


def origin_of(url: str) -> str:
    """The normalized origin ``scheme://host:port`` of an absolute http(s) URL, as targets'
    ``origin`` and ``redirect_origins`` are stored.  Raises ``ValueError`` for anything else."""
    scheme, host, port, _path, _parts = _parse_url(url, ("http", "https"), "url")
    return f"{scheme}://{_host_for_url(host)}:{port}"


# --- the loader ---------------------------------------------------------------------------------


class _Loader:
    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir

    def resolve_path(self, value: str) -> Path:
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else self.base_dir / p

    def config(self, data: Mapping[str, Any], path: Path | None) -> Config:
        top = _Table(data, "")
        journal = self.journal(top.get("journal", {}))
        vault_path: Path | None = None
        if top.has("vault"):
            vt = _Table(top.get("vault"), "vault")
            vault_path = self.resolve_path(vt.string("path", "affidavit.vault"))
            vt.finish("path")
        raw_targets = top.get("targets", {})
        tt = _Table(raw_targets, "targets")
        targets: dict[str, Target] = {}
        for name in raw_targets:
            tt.seen.add(name)
            if not isinstance(name, str) or not _TARGET_NAME.fullmatch(name):
                raise ConfigError(
                    f"targets.{name}", "target names are 1-64 characters of A-Z a-z 0-9 _ . -"
                )
            targets[name] = self.target(name, raw_targets[name], vault_path is not None)
        top.finish("journal, vault, targets")
        return Config(
            path=path,
            journal=journal,
            vault_path=vault_path,
            targets=MappingProxyType(targets),
        )

    def journal(self, data: object) -> JournalConfig:
        jt = _Table(data, "journal")
        path = self.resolve_path(jt.string("path", "affidavit.db"))
        key_raw = jt.string("key_file", None)
        key_file = self.resolve_path(key_raw) if key_raw else Path(f"{path}.key")
        auditor_raw = jt.string("auditor_public_key", None)
        auditor = None
        if auditor_raw:
            auditor = self.resolve_path(auditor_raw)
            if not auditor.is_file():
                raise ConfigError("journal.auditor_public_key", f"file not found: {auditor}")
        jt.finish("path, key_file, auditor_public_key")
        return JournalConfig(path, key_file, auditor)

    def common(self, t: _Table, has_vault: bool) -> tuple[str, int, Timeouts]:
        field = t.path("credential")
        ref = t.string("credential")
        try:
            kind, name = parse_ref(ref)
        except CredentialError as exc:
            raise ConfigError(field, exc.message) from None
        if kind == "vault" and not has_vault:
            raise ConfigError(field, "a vault: reference needs a [vault] section")
        if kind == "file":
            ref = f"file:{self.resolve_path(name)}"
        budget = t.integer("budget", DEFAULT_BUDGET, 1, MAX_BUDGET)
        return ref, budget, self.timeouts(t)

    def timeouts(self, t: _Table) -> Timeouts:
        raw = t.get("timeout", {})
        tt = _Table(raw, t.path("timeout"))
        values: list[float] = []
        for key, default in zip(("connect", "total"), DEFAULT_TIMEOUTS, strict=True):
            v = tt.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ConfigError(tt.path(key), f"must be a number of seconds, not {_kind_of(v)}")
            if not math.isfinite(v) or v <= 0 or v > 86400:
                raise ConfigError(tt.path(key), "must be > 0 and at most 86400 seconds")
            values.append(float(v))
        tt.finish("connect, total")
        if values[0] > values[1]:
            raise ConfigError(tt.path("connect"), "must not exceed timeout.total")
        return Timeouts(values[0], values[1])

    def target(self, name: str, data: object, has_vault: bool) -> Target:
        prefix = f"targets.{name}"
        t = _Table(data, prefix)
        kind = t.get("kind")
        if kind == "http":
            return self.http(name, t, has_vault)
        if kind == "ssh":
            return self.ssh(name, t, has_vault)
        raise ConfigError(t.path("kind"), 'must be "http" or "ssh"')

    def methods(self, t: _Table, key: str, required: bool) -> frozenset[str]:
        items = t.string_list(key) if required else t.string_list(key, [])
        if required and not items:
            raise ConfigError(t.path(key), "must list at least one method")
        out = set()
        for i, m in enumerate(items):
            if not _TOKEN.fullmatch(m):
                raise ConfigError(f"{t.path(key)}[{i}]", "is not an HTTP method token")
            out.add(m.upper())
        return frozenset(out)

    def http(self, name: str, t: _Table, has_vault: bool) -> HttpTarget:
        url_field = t.path("url")
        try:
            scheme, host, port, path, _parts = _parse_url(t.string("url"), ("http", "https"), "url")
        except ValueError as exc:
            raise ConfigError(url_field, str(exc)) from None
        if _parts.query or _parts.fragment or _value_has(t.data["url"], "?#"):
            raise ConfigError(url_field, "must not have a query or fragment")
        if not _PATH_CHARS.fullmatch(path) or re.search(r"%(?![0-9A-Fa-f]{2})", path):
            raise ConfigError(url_field, "base path has characters that need percent-encoding")
        segments = [s for s in path.split("/") if s]
        if any(urllib.parse.unquote(s) in (".", "..") for s in segments):
            raise ConfigError(url_field, 'base path must not contain "." or ".." segments')
        base_path = "/" + "/".join(segments) if segments else ""
        origin = f"{scheme}://{_host_for_url(host)}:{port}"
        default_port = {"http": 80, "https": 443}[scheme]
        netloc = _host_for_url(host) + ("" if port == default_port else f":{port}")
        url = f"{scheme}://{netloc}{base_path}"

        methods = self.methods(t, "methods", required=True)
        idempotent = self.methods(t, "idempotent", required=False)
        credential, budget, timeout = self.common(t, has_vault)

        inject = t.string("inject", "bearer")
        try:
            inject_kind, inject_name = parse_inject(inject)
        except ValueError as exc:
            raise ConfigError(t.path("inject"), str(exc)) from None

        ca_file = None
        ca_raw = t.string("ca_file", None)
        if ca_raw:
            if scheme != "https":
                raise ConfigError(t.path("ca_file"), "only applies to an https:// url")
            ca_file = self.resolve_path(ca_raw)
            if not ca_file.is_file():
                raise ConfigError(t.path("ca_file"), f"file not found: {ca_file}")

        proxy = None
        proxy_raw = t.string("proxy", None)
        if proxy_raw:
            try:
                _, phost, pport, ppath, pparts = _parse_url(proxy_raw, ("http",), "proxy")
            except ValueError as exc:
                raise ConfigError(t.path("proxy"), str(exc)) from None
            if ppath not in ("", "/") or pparts.query or pparts.fragment:
                raise ConfigError(t.path("proxy"), "must be http://host:port with no path")
            proxy = f"http://{_host_for_url(phost)}:{pport}"

        follow = t.boolean("follow_redirects", False)
        redirect_origins: set[str] = set()
        for i, raw_origin in enumerate(t.string_list("redirect_origins", [])):
            where = f"{t.path('redirect_origins')}[{i}]"
            try:
                _s, _h, _p, rpath, rparts = _parse_url(raw_origin, ("http", "https"), "origin")
                normalized = origin_of(raw_origin)
            except ValueError as exc:
                raise ConfigError(where, str(exc)) from None
            if rpath not in ("", "/") or rparts.query or rparts.fragment:
                raise ConfigError(where, "must be an origin: scheme://host[:port] with no path")
            redirect_origins.add(normalized)
        if redirect_origins and not follow:
            raise ConfigError(
                t.path("redirect_origins"), "only applies with follow_redirects = true"
            )
        max_body = t.integer("max_body", DEFAULT_MAX_BODY, 0, 1 << 40)

        idem = None
        if t.has("idempotency"):
            it = _Table(t.get("idempotency"), t.path("idempotency"))
            header = it.string("header", max_len=128)
            lower = header.lower()
            if not _TOKEN.fullmatch(header):
                raise ConfigError(it.path("header"), "is not an HTTP header name")
            if (
                lower in TRANSPORT_HEADERS
                or lower in CREDENTIAL_HEADERS
                or (inject_kind == "header" and inject_name and lower == inject_name.lower())
            ):
                raise ConfigError(it.path("header"), "names a header the broker already owns")
            scope = it.string("scope", max_len=256)
            try:
                retention = parse_duration(it.get("retention"))
            except ValueError as exc:
                raise ConfigError(it.path("retention"), str(exc)) from None
            it.finish("header, scope, retention")
            idem = IdempotencyContract(header, scope, retention)

        t.finish(
            "kind, url, methods, idempotent, credential, inject, ca_file, proxy, "
            "follow_redirects, redirect_origins, max_body, budget, timeout, idempotency"
        )
        return HttpTarget(
            name=name,
            url=url,
            origin=origin,
            base_path=base_path,
            methods=methods,
            idempotent=idempotent,
            credential=credential,
            inject=inject,
            ca_file=ca_file,
            proxy=proxy,
            follow_redirects=follow,
            redirect_origins=frozenset(redirect_origins),
            max_body=max_body,
            budget=budget,
            timeout=timeout,
            idempotency=idem,
        )

    def ssh(self, name: str, t: _Table, has_vault: bool) -> SshTarget:
        try:
            host = _check_host(t.string("host", max_len=253))
        except ValueError as exc:
            raise ConfigError(t.path("host"), str(exc)) from None
        port = t.integer("port", 22, 1, 65535)
        user = t.string("user", max_len=64)
        if not _SSH_USER.fullmatch(user):
            raise ConfigError(t.path("user"), "must be a plain user name (A-Z a-z 0-9 _ . @ -)")

        if t.has("host_key") == t.has("known_hosts"):
            raise ConfigError(t.path("host_key"), "set exactly one of host_key or known_hosts")
        keys: tuple[str, ...]
        if t.has("host_key"):
            raw = t.get("host_key")
            items = [raw] if isinstance(raw, str) else raw
            if not isinstance(items, list) or not items:
                raise ConfigError(t.path("host_key"), "must be a key string or an array of them")
            found = set()
            for i, item in enumerate(items):
                where = t.path("host_key") + ("" if isinstance(raw, str) else f"[{i}]")
                if not isinstance(item, str):
                    raise ConfigError(where, "must be a string")
                try:
                    found.add(_check_host_key(item))
                except ValueError as exc:
                    raise ConfigError(where, str(exc)) from None
            keys = tuple(sorted(found))
        else:
            kh = self.resolve_path(t.string("known_hosts"))
            try:
                text = kh.read_text("utf-8", errors="replace")
            except OSError as exc:
                raise ConfigError(
                    t.path("known_hosts"), f"cannot read {kh} ({exc.strerror})"
                ) from None
            keys = known_host_keys(text, host, port)
            if not keys:
                raise ConfigError(t.path("known_hosts"), f"{kh} has no usable key for this host")

        credential, budget, timeout = self.common(t, has_vault)
        commands = frozenset(t.string_list("idempotent_commands", []))
        max_stdin = t.integer("max_stdin", DEFAULT_MAX_STDIN, 0, 1 << 40)
        t.finish(
            "kind, host, port, user, host_key, known_hosts, credential, idempotent_commands, "
            "budget, timeout, max_stdin"
        )
        return SshTarget(
            name=name,
            host=host,
            port=port,
            user=user,
            host_keys=keys,
            credential=credential,
            idempotent_commands=commands,
            budget=budget,
            timeout=timeout,
            max_stdin=max_stdin,
        )


def _value_has(value: object, chars: str) -> bool:
    return isinstance(value, str) and any(c in value for c in chars)


# --- snapshot -----------------------------------------------------------------------------------


def canonical_json(value: object) -> bytes:
    """Sorted keys, no whitespace, UTF-8: one byte string per value, for hashing."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def snapshot(target: Target) -> dict[str, Any]:
    """The normalized, canonical, secret-free description of ``target`` that an invocation is
    bound to.  Credential *references* are included (changing the selected secret must change
    the binding); credential values never are — they are not even loaded here."""
    timeout = {"connect": target.timeout.connect, "total": target.timeout.total}
    if isinstance(target, HttpTarget):
        idem = target.idempotency
        return {
            "kind": "http",
            "name": target.name,
            "url": target.url,
            "origin": target.origin,
            "base_path": target.base_path,
            "methods": sorted(target.methods),
            "idempotent": sorted(target.idempotent),
            "credential": target.credential,
            "inject": target.inject,
            "ca_file": str(target.ca_file) if target.ca_file else None,
            "proxy": target.proxy,
            "follow_redirects": target.follow_redirects,
            "redirect_origins": sorted(target.redirect_origins),
            "max_body": target.max_body,
            "budget": target.budget,
            "timeout": timeout,
            "idempotency": (
                {"header": idem.header, "scope": idem.scope, "retention_s": idem.retention_s}
                if idem
                else None
            ),
        }
    return {
        "kind": "ssh",
        "name": target.name,
        "host": target.host,
        "port": target.port,
        "user": target.user,
        "host_keys": sorted(target.host_keys),
        "credential": target.credential,
        "idempotent_commands": sorted(target.idempotent_commands),
        "budget": target.budget,
        "timeout": timeout,
        "max_stdin": target.max_stdin,
    }


def snapshot_hash(target: Target) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(snapshot(target))).hexdigest()


# --- the sample ---------------------------------------------------------------------------------

_SAMPLE = """\
# Affidavit configuration.  Relative paths resolve against this file's directory.
# Reference: docs/configuration.md

[journal]
path = "affidavit.db"               # the append-only evidence journal (SQLite)
# key_file = "affidavit.db.key"     # broker sealing key (default: <path>.key)
# auditor_public_key = "auditor.pub"

[vault]
path = "affidavit.vault"            # `affidavit vault init`, then `affidavit vault put NAME`

# An HTTP target.  The caller names it; the broker injects the credential.
[targets.example]
kind = "http"
url = "https://api.example.com/v1"   # origin plus an optional base path
methods = ["GET", "POST"]             # what callers may send
idempotent = ["GET"]                  # methods THIS service treats as idempotent (retried on
                                      # unknown outcome); never assumed from the method name
credential = "env:EXAMPLE_TOKEN"      # env:NAME | file:PATH | vault:NAME
inject = "bearer"                     # bearer | basic | header:NAME | query:NAME
# ca_file = "ca.pem"                  # trust only this CA bundle
# proxy = "http://127.0.0.1:3128"
follow_redirects = false
# redirect_origins = ["https://files.example.com"]  # other origins a redirect may reach
max_body = 1048576                    # request body limit, bytes
budget = 3                            # attempts per invocation, recorded in the journal
timeout = { connect = 5, total = 30 }
# Only if the service documents key-based deduplication:
# idempotency = { header = "Idempotency-Key", scope = "payments.create", retention = "24h" }

# An SSH target.  Pin the host key (replace this placeholder with the real one, e.g. from
# `ssh-keyscan -t ed25519 HOST`) or point known_hosts at a file.
[targets.deploy]
kind = "ssh"
host = "127.0.0.1"
port = 22
user = "deploy"
host_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
# known_hosts = "known_hosts"
credential = "vault:deploy_key"       # an OpenSSH private key stored in the vault
idempotent_commands = []              # exact commands known to be safe to repeat
timeout = { connect = 10, total = 600 }
"""


def sample_config() -> str:
    """The commented sample ``affidavit init`` writes.  It loads cleanly (tested)."""
    return _SAMPLE
