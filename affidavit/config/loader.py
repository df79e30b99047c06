"""``affidavit.toml``: locating, reading and validating it into a frozen ``Config``.

``[journal]`` and ``[vault]`` are declared here, ``[service]`` in ``service``; each
``[targets.NAME]`` is read by the target schema of the protocol its ``kind`` names, found in
the protocol registry (``affidavit.protocols``).  Every problem is a ``ConfigError`` naming the
file, the field path to fix (``targets.billing.inject``) and why — never a traceback.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import logging
import os
import re
import threading
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from affidavit.bounds import MAX_RECONNECT
from affidavit.privatefile import FileMissing, FileRefused, read_small_file
from affidavit.protocols import ProtocolLoadError, get, kinds
from affidavit.schema import (
    CONFIG_NOT_FOUND,
    CONFIG_UNREADABLE,
    ConfigError,
    Field,
    LoadContext,
    Read,
    Schema,
    Section,
    Target,
    duration_setting,
)

from .service import MIN_SHARED_LEASE_MARGIN, SERVICE, ServiceConfig

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG",
    "JOURNAL",
    "MAX_CONFIG_BYTES",
    "TRANSIENT_READ_ERRNOS",
    "VAULT",
    "Config",
    "ConfigUnread",
    "JournalConfig",
    "caveats",
    "config_from_dict",
    "config_path",
    "load_config",
    "parse_config",
    "read_config",
    "send_windows",
]

CONFIG_ENV = "AFFIDAVIT_CONFIG"
DEFAULT_CONFIG = "affidavit.toml"
SECTIONS = ("journal", "vault", "service", "targets")

_TARGET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}")


@dataclass(frozen=True)
class JournalConfig:
    path: Path
    url: str | None = field(repr=False)
    """A shared PostgreSQL journal (``postgresql://...``); None: the SQLite file ``path``.  Out
    of the repr: it may hold the database's password (a ``Config`` logged or in a traceback's
    locals must not show it)."""
    key_file: Path
    signing_key: Path
    auditor_public_key: Path | None
    reconnect: float
    """A shared journal: seconds a broker that lost the database tries to reconnect before it
    fails the writes in flight (a restart shorter than this is invisible to callers)."""

    @property
    def location(self) -> str | Path:
        """What ``Journal.open`` takes: the URL, else the file."""
        return self.url if self.url else self.path

    @property
    def key_files(self) -> tuple[Path, ...]:
        """Every key file configured: their paths are kept from a caller as the journal's
        location is (``engine.unplaced``)."""
        keys = (self.key_file, self.signing_key, self.auditor_public_key)
        return tuple(k for k in keys if k is not None)


@dataclass(frozen=True)
class _VaultConfig:
    path: Path


@dataclass(frozen=True)
class Config:
    path: Path | None
    journal: JournalConfig
    vault_path: Path | None
    targets: Mapping[str, Target]
    service: ServiceConfig
    """``[service]``, read by ``affidavit serve`` only (defaults when the section is absent)."""
    descriptions: Mapping[str, str] = field(default_factory=dict)
    """Each target's ``description``: for its callers (``list_targets``), so never bound to an
    invocation -- it changes nothing that is sent, or to whom."""
    source_digest: bytes | None = field(default=None, repr=False, compare=False)
    """The SHA-256 of the file's bytes it was parsed from (``parse_config``; None when built
    from a mapping): the dispatch gate's re-check (``engine.snapshot``) then knows the file
    still says this without parsing it again -- a parse would also judge what the file names
    (a CA file removed since), which is not an edit of the configuration."""


def _path(r: Read) -> Path:
    return r.resolve_path(r.string())


_URL_SCHEMES = ("postgresql://", "postgres://")


def _url(r: Read) -> str | None:
    raw = r.string()
    if raw is None:
        return None
    # Never quote the value: it may hold a password.
    if not raw.startswith(_URL_SCHEMES):
        raise r.error("must be a postgresql:// URL (a SQLite journal is set with path)")
    if any(c.isspace() for c in raw):
        raise r.error("must be one URL, without spaces")
    if r.section.has("path"):
        raise r.error("set either path (a SQLite file) or url (PostgreSQL), not both")
    return str(raw)


def _broker_file(suffix: str, what: str) -> Callable[[Read], Path]:
    def parse(r: Read) -> Path:
        raw = r.string()
        if raw:
            return r.resolve_path(raw)
        if r.values["url"]:
            raise r.error(f"is required with url: {what}")
        # Beside the file the path names (a link resolved), as the journal keeps its other
        # files (journal/names.py; this layer may not import it): where a link's old key lies
        # instead, the journal's open refuses with the ``mv`` that fixes it.
        return Path(f"{os.path.realpath(r.values['path'])}{suffix}")

    return parse


_key_file = _broker_file(
    ".key", "the sealing key file, the same on every broker sharing the journal"
)
_signing_key = _broker_file(".signing.key", "this broker's own signing key file")


def _existing_file(r: Read) -> Path | None:
    raw = r.string()
    if not raw:
        return None
    path = r.resolve_path(raw)
    if not path.is_file():
        raise r.error(f"file not found: {path}")
    return path


def _reconnect(r: Read) -> float:
    seconds = duration_setting(r)
    if seconds > MAX_RECONNECT:
        raise r.error(f"must be at most {MAX_RECONNECT:.0f} seconds")
    return seconds


JOURNAL = Schema(
    JournalConfig,
    (
        Field(
            "path",
            _path,
            default="affidavit.db",
            doc="the append-only evidence journal (a SQLite file)",
        ),
        Field(
            "url",
            _url,
            default=None,
            doc="a shared PostgreSQL journal instead of the file (`postgresql://user@host/db`; "
            "keep the password out of it: libpq reads `PGPASSWORD` or `~/.pgpass`); several "
            "brokers may share one (docs/journal.md)",
        ),
        Field(
            "key_file",
            _key_file,
            default=None,
            shown="`<path>.key`",
            doc="the broker's sealing key for sensitive payloads (with `url`: required, and "
            "the same file on every broker)",
        ),
        Field(
            "signing_key",
            _signing_key,
            default=None,
            shown="`<path>.signing.key`",
            doc="the Ed25519 key that signs each transaction's checkpoint (created 0600 if "
            "absent; `affidavit journal public-key` exports its public half for auditors; with "
            "`url`: required, one per broker)",
        ),
        Field(
            "auditor_public_key",
            _existing_file,
            default=None,
            doc="seal an auditor copy of event payloads and stored results to this X25519 "
            "public key (the file must exist; the broker cannot open them)",
        ),
        Field(
            "reconnect",
            _reconnect,
            default=10,
            doc="with `url` (at most 3600, an hour: a client waits that long for a read of the "
            "journal): seconds a broker that lost the database keeps reconnecting before "
            "it fails the writes in flight (never claiming a commit it cannot read back), and "
            "the longest a write waits for the chain head another session holds (then it fails, "
            "not committed), and the longest a call's read of the journal may take (then it is "
            "declined, JOURNAL_READ_DECLINED)",
        ),
    ),
)
VAULT = Schema(
    _VaultConfig,
    (
        Field(
            "path",
            _path,
            default="affidavit.vault",
            doc="the encrypted secrets file used by `vault:NAME` references",
        ),
    ),
)


def config_path(explicit: str | None) -> Path:
    """``--config`` beats ``$AFFIDAVIT_CONFIG`` beats ``./affidavit.toml`` -- made absolute, so
    that every message names the file one way (``affidavit init``'s, every error's, as the field
    errors do), or as given when there is no working directory to resolve it against (one
    removed under us)."""
    named = Path(explicit or os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG)
    try:
        return Path(os.path.abspath(named))
    except OSError:
        return named


def _refuse_file_as_directory(explicit: str | None, path: Path) -> None:
    """``--config a.toml/`` (or ``a.toml/.``): the kernel answers ENOTDIR for a file named so,
    but ``config_path`` (a ``Path``) has dropped the ``/`` -- said here, as the kernel would,
    before the file is read (a directory, or nothing, there: left to the read to say)."""
    named = explicit or os.environ.get(CONFIG_ENV) or ""
    if not named.endswith(("/", "/.")):
        return
    try:
        os.stat(named)
    except NotADirectoryError:
        raise ConfigError(
            "",
            "cannot read config file: cannot open file (Not a directory)",
            path,
            CONFIG_UNREADABLE,
        ) from None
    except (OSError, ValueError):
        return


MAX_CONFIG_BYTES = 1 << 20
"""The largest config file read (1 MiB: a config of a thousand targets is a tenth of it)."""


TRANSIENT_READ_ERRNOS = frozenset(
    {
        errno.EMFILE,
        errno.ENFILE,
        errno.ENOMEM,
        errno.ENOBUFS,
        errno.EIO,
        errno.EINTR,
        errno.EAGAIN,
        errno.ETIMEDOUT,
        errno.ENOLCK,
        errno.ECOMM,
        errno.EHOSTDOWN,
    }
)
"""The errnos of a config read that failed for a reason of this process or its machine (no
descriptor left, no memory, an I/O error, an interrupted or would-block call) or of the network
a network filesystem reaches its server over (a timeout, no lock manager, a communication error,
the server down), not of what the path holds: ``ConfigUnread``.  ``ESTALE`` is not among them:
the file handle names a file replaced or removed on the server -- an edit.  Every other errno
describes the path -- a socket there (``ENXIO``), a symlink loop (``ELOOP``), a parent now a
file (``ENOTDIR``), a name too long, a permission taken away (``EACCES``/``EPERM``: an
operator's edit) -- and is the plain ``ConfigError`` a running broker's gate takes for an edit
(CONFIG_CHANGED; audit 53b r2)."""


class ConfigUnread(ConfigError):
    """CONFIG_UNREADABLE because reading the file failed with a ``TRANSIENT_READ_ERRNOS``
    ``errno`` (no descriptor left, an I/O error), not because of what the path holds: it says
    nothing of the configuration -- a running broker's dispatch gate must not take it for an
    edit."""

    def __init__(self, message: str, path: Path, errno: int) -> None:
        super().__init__("", message, path, CONFIG_UNREADABLE)
        self.errno = errno


def read_config(
    path: Path, opener: Callable[[Path], int] | None = None
) -> tuple[bytes, os.stat_result]:
    """The bytes of the config file at ``path`` and its ``fstat`` as read, through
    ``read_small_file`` (opened by ``opener`` when given: ``api.trusted``'s, judging what it
    opens): a FIFO there neither blocks the read nor a huge file swells it (the running broker
    reads it again before a dispatch: ``engine.snapshot``).  Not ``private``: the config names
    credentials, never holds them (its journal URL's password is the start's ``exposed_files``
    check).  ``ConfigUnread`` when the read itself failed for a transient reason
    (``TRANSIENT_READ_ERRNOS``), ``ConfigError`` for any other refusal."""
    try:
        return read_small_file(path, MAX_CONFIG_BYTES, subject="config file", opener=opener)
    except FileMissing:
        raise ConfigError(
            "", "config file not found (create one with `affidavit init`)", path, CONFIG_NOT_FOUND
        ) from None
    except FileRefused as exc:
        if exc.errno in TRANSIENT_READ_ERRNOS:
            raise ConfigUnread(f"cannot read config file: {exc}", path, exc.errno) from None
        raise ConfigError("", f"cannot read config file: {exc}", path, CONFIG_UNREADABLE) from None


def parse_config(raw: bytes, path: Path) -> Config:
    """Validate the bytes ``read_config`` read from ``path`` (relative paths inside resolve
    against its directory)."""
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("", "config file is not UTF-8", path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"invalid TOML: {exc}", path) from None
    except RecursionError:  # `a = [[[[...` a hundred thousand deep fits in MAX_CONFIG_BYTES
        raise ConfigError("", "invalid TOML: nested too deeply", path) from None
    config = config_from_dict(data, base_dir=path.parent, path=path)
    return dataclasses.replace(config, source_digest=hashlib.sha256(raw).digest())


_TOLD: set[tuple[str, bytes | None]] = set()
"""(config path, content digest) pairs whose caveats this process has logged: ``actions``,
``metrics`` and ``journal verify`` load the config twice, a program may start several embedded
brokers from one file.  One entry per distinct content loaded, which ``load_config`` (unlike
``parse_config``) is only at a command's or a broker's start."""
_TOLD_LOCK = threading.Lock()


def load_config(
    path: str | Path | None = None, opener: Callable[[Path], int] | None = None
) -> Config:
    """Read and validate a config file (opened by ``opener``, when given: ``read_config``).
    Relative paths inside resolve against its directory.  What it allows but an operator should
    know (``caveats``) is logged, one WARNING each, once per process for each path and content
    -- here, not in ``parse_config``, which a running broker calls again before dispatches."""
    p = config_path(str(path) if path is not None else None)
    _refuse_file_as_directory(str(path) if path is not None else None, p)
    config = parse_config(read_config(p, opener)[0], p)
    told = (os.path.abspath(p), config.source_digest)
    with _TOLD_LOCK:
        new = told not in _TOLD
        _TOLD.add(told)
    for words in caveats(config) if new else ():
        logging.getLogger("affidavit.config").warning("%s", words)
    return config


def caveats(config: Config) -> list[str]:
    """What ``config`` allows that is no safeguard: by target, an ``approval`` whose
    ``commands`` list names what waits (``ApprovalPolicy.caveat``)."""
    out = []
    for name, target in config.targets.items():
        policy = getattr(target, "approval", None)
        caveat = policy.caveat if policy is not None else None
        if caveat is not None:
            out.append(f"targets.{name}.approval.commands: {caveat}")
    return out


def config_from_dict(
    data: Mapping[str, Any], *, base_dir: Path, path: Path | None = None
) -> Config:
    """Validate an already-parsed config (what ``load_config`` does after TOML parsing)."""
    try:
        return _config(data, LoadContext(Path(os.path.abspath(base_dir))), path)
    except ConfigError as exc:
        exc.file = str(path) if path is not None else None
        raise


def _config(data: Mapping[str, Any], context: LoadContext, path: Path | None) -> Config:
    top = Section(data, "")
    journal = JOURNAL.load(top.get("journal", {}), "journal", context)
    vault_path = VAULT.load(top.get("vault"), "vault", context).path if top.has("vault") else None
    service = SERVICE.load(top.get("service", {}), "service", context)
    context = LoadContext(context.base_dir, has_vault=vault_path is not None)
    raw_targets = top.get("targets", {})
    section = Section(raw_targets, "targets")
    targets: dict[str, Target] = {}
    descriptions: dict[str, str] = {}
    for name in raw_targets:
        section.seen.add(name)
        if not isinstance(name, str) or not _TARGET_NAME.fullmatch(name):
            raise ConfigError(
                f"targets.{name}", "target names are 1-64 characters of A-Z a-z 0-9 _ . -"
            )
        targets[name], descriptions[name] = _target(name, raw_targets[name], context)
    top.finish(SECTIONS)
    if journal.url is not None and service.lease_margin < MIN_SHARED_LEASE_MARGIN:
        # Checked here, where the journal is known: the margin is the clock skew tolerated
        # between the hosts sharing a journal (``MIN_SHARED_LEASE_MARGIN``).
        raise ConfigError(
            "service.lease_margin",
            f"must be at least {MIN_SHARED_LEASE_MARGIN:g} s on a shared journal ([journal] "
            "url): it is the clock skew tolerated between the hosts, and with less another "
            "daemon may close and retry a call that is still being dispatched",
        )
    for name, target in targets.items():
        if getattr(target, "approval", None) is not None and not service.has_operators:
            # Every such request would wait until it expired.
            raise ConfigError(
                f"targets.{name}.approval",
                "nobody may approve: list operators in [service] operator_uids or operator_gids",
            )
    return Config(
        path=path,
        journal=journal,
        vault_path=vault_path,
        targets=MappingProxyType(targets),
        service=service,
        descriptions=MappingProxyType(descriptions),
    )


def _target(name: str, data: object, context: LoadContext) -> tuple[Target, str]:
    """Dispatch on ``kind`` through the protocol registry; the ``description`` every kind of
    target may have is read here, beside ``kind``."""
    t = Section(data, f"targets.{name}")
    description: str = t.string("description", "", max_len=1024)
    kind = t.get("kind")
    try:
        spec = get(kind) if isinstance(kind, str) else None
    except ProtocolLoadError as exc:
        raise ConfigError(t.path("kind"), exc.message) from None
    if spec is None:
        raise ConfigError(t.path("kind"), _one_of(kinds()))
    target: Target = spec.target.read_target(name, t, context)
    return target, description


def _one_of(names: list[str]) -> str:
    if not names:
        # Only a stale install: the built-in protocols are entry points in the package metadata.
        return "no protocol is installed (reinstall affidavit: pip install -e .)"
    quoted = [f'"{k}"' for k in names]
    if len(quoted) == 1:
        return f"must be {quoted[0]}"
    return f"must be {', '.join(quoted[:-1])} or {quoted[-1]}"


def send_windows(config: Config, lease_margin: float) -> dict[str, float]:
    """By target, the lease a same-key retry takes now with the target's default timeout:
    ``timeout.total`` + ``lease_margin`` (``Engine.lease_ttl``).  A reader given it
    (``JournalReader.send_windows``) judges each record's key-bound hints by it, not only by
    the window the record holds from when it was accepted (a ``lease_margin`` raised since)."""
    return {name: float(t.timeout.total) + lease_margin for name, t in config.targets.items()}
