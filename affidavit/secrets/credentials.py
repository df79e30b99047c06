"""Credential references, resolution and HTTP injection.

Seed, "Validation and credential injection finish before dispatch": failing to obtain, resolve or
inject a credential is ``phase=credential_injection, outcome=not_attempted`` — *if* the broker
stops before a single byte of the request left.  Everything here is local and synchronous, so it
always finishes before the engine opens a connection.

"Do not put credential contents into either the error or the action record.  You may record the
secret's identifier or its non-secret version, the injection method, and the decision that
stopped the call."  Hence:

* ``CredentialError`` messages say the reason, never the value -- nor, for the caller, the
  reference, a path or a variable name (``message``); the operator's ``detail`` names the
  reference.  A *malformed* reference is not echoed at all: the classic way to get one is pasting
  the secret itself into ``credential = "…"``.
* ``Credential`` carries a non-secret ``version`` (file mtime+ctime+inode; for ``env:`` and
  ``systemd:`` a keyed digest of the value, ``Versioner``; for ``vault:`` the entry's counter
  and a digest of the value keyed from the vault's own key, ``N:vault:hmac-sha256:…``) for the
  engine to journal, and its ``repr``/``str`` never show the value.
* ``redactor`` (``affidavit.secrets.redaction``, re-exported here) scrubs the injected values,
  in every form docs/redaction.md lists, out of anything the remote echoes back before it
  reaches a journal row, a log line or the caller.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from affidavit.privatefile import FileMissing, FileRefused, read_small_file
from affidavit.statemachine import Code

from .redaction import REDACTED, Redactor, redactor, secret_forms
from .vault import EntryMissing, Vault, VaultCorrupt, VaultError, VaultLocked, VaultMissing

__all__ = [
    "CREDENTIALS_DIRECTORY",
    "INJECTION_SCHEMES",
    "MAX_CREDENTIAL_BYTES",
    "REDACTED",
    "REFERENCE_FORMS",
    "Credential",
    "CredentialError",
    "Injection",
    "Redactor",
    "Versioner",
    "apply_query",
    "inject_http",
    "parse_inject",
    "parse_ref",
    "predates_value_digests",
    "redactor",
    "resolve",
    "secret_forms",
    "systemd_name_valid",
    "systemd_path",
    "trim_final_newline",
]

MAX_CREDENTIAL_BYTES = 64 * 1024
"""A ``file:`` credential larger than this is refused (CREDENTIAL_INVALID): a token, a password
or a private key is a few KiB at most, and the file is read inside the event loop."""

CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"
"""The environment variable systemd sets to a unit's credentials directory (``systemd:``)."""

INJECTION_SCHEMES = ("bearer", "basic", "header:NAME", "query:NAME")

Versioner = Callable[[str, bytes], str]
"""``(label, value) -> digest``: a keyed digest (HMAC) of a credential's value, its ``env:``
version.  An environment variable has no version of its own, and a constant one would let an
approval granted for one value stay valid after the variable is swapped; a plain hash of a
short token would give it away to a dictionary.  The engine's is keyed by the journal's broker
key (``Journal.keyed_digest``): the same value is the same version in every process of the
journal and across restarts, and a different value a different one."""

_PROCESS_KEY = os.urandom(32)


def _process_versioner(label: str, value: bytes) -> str:
    """The fallback ``Versioner`` (no journal key at hand): keyed by a random per-process key,
    so it changes with the value but is comparable only within this process."""
    return hmac.new(_PROCESS_KEY, label.encode("utf-8") + b"\0" + value, hashlib.sha256).hexdigest()


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_VAULT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
# RFC 9110 §5.6.2 token
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 3986 unreserved: a query parameter name we inject must not need escaping (it also appears
# in docs and error messages, and must match what the caller is forbidden to send).
_QUERY_NAME = re.compile(r"[A-Za-z0-9_.\-~]{1,128}")
# Headers the transport owns; injecting a credential into them would corrupt framing/routing.
_RESERVED_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "te", "upgrade", "trailer"}
)


class CredentialError(Exception):
    """A credential could not be obtained or injected.  ``str()`` never contains the value.

    ``message`` is for the caller: what is wrong, never the reference, a path or a variable
    name (the caller is an agent; the error's ``field`` says which setting to fix).
    ``detail`` is for the operator (sealed in the journal with CREDENTIAL_FAILED): the
    reference, then the reason with every name and path that helps to fix it -- never the
    value either; ``str()`` is the code and the detail."""

    def __init__(
        self, code: Code, message: str, *, ref: str | None = None, detail: str | None = None
    ) -> None:
        self.code = code
        self.message = message
        reason = message if detail is None else detail
        self.detail = reason if ref is None else f"{ref}: {reason}"
        super().__init__(f"{code.value}: {self.detail}")  # the operator's words


@dataclass(frozen=True, repr=False)
class Credential:
    """A resolved secret.  ``ref`` and ``version`` are safe to record; ``value`` never is."""

    ref: str
    value: bytes
    version: str

    def __repr__(self) -> str:
        return f"Credential(ref={self.ref!r}, version={self.version!r}, value=<redacted>)"

    __str__ = __repr__


def _keyed_version(kind: str, ref: str, value: bytes, versioner: Versioner | None) -> str:
    """``<kind>:hmac-sha256:<digest>``: the version of a credential whose source has none of
    its own (``Versioner``)."""
    digest = (versioner or _process_versioner)("credential-version:" + ref, value)
    return f"{kind}:hmac-sha256:{digest[:32]}"


def predates_value_digests(version: str) -> bool:
    """Whether a bound ``version`` is a vault entry's bare counter ("3"), journaled before
    vault versions carried a value digest: no version ``resolve`` gives now is, so such a
    binding never matches again -- the safe side, since the counter alone cannot tell which
    value was sent -- and the operator is told it is the upgrade, not a rotation.  ASCII digits
    only: the literal "env" an env: credential's version was before it was keyed has no ':'
    either, and that upgrade is not this one."""
    return version.isascii() and version.isdigit()


def trim_final_newline(data: bytes) -> bytes:
    """Drop the final newline editors and ``echo`` add (a token sent with it would be a malformed
    header) — only for single-line values, so a PEM/OpenSSH private key keeps its exact bytes."""
    for ending in (b"\r\n", b"\n"):
        if data.endswith(ending):
            head = data[: -len(ending)]
            return head if b"\n" not in head else data
    return data


REFERENCE_FORMS = "env:NAME, file:PATH, systemd:NAME or vault:NAME"
"""What a credential reference may be (``parse_ref``), as its refusals word it."""


def parse_ref(ref: str) -> tuple[str, str]:
    """Split ``env:NAME`` / ``file:PATH`` / ``systemd:NAME`` / ``vault:NAME``.  Anything else is
    UNKNOWN_CREDENTIAL (seed: "unknown credential references" are rejected at validation).
    Used by the config loader too, so a bad reference fails at load time, not on the first
    call."""
    if isinstance(ref, str):
        kind, sep, name = ref.partition(":")
        if sep:
            if kind == "env" and _ENV_NAME.fullmatch(name):
                return kind, name
            if kind == "file" and name and "\x00" not in name:
                return kind, name
            if kind == "vault" and _VAULT_NAME.fullmatch(name):
                return kind, name
            if kind == "systemd":
                if systemd_name_valid(name):
                    return kind, name
                raise CredentialError(
                    Code.UNKNOWN_CREDENTIAL,
                    "a systemd:NAME credential's NAME is a file name in the credentials "
                    "directory: printable ASCII, not empty, no '/' or ':', not '.' or '..', at "
                    "most 255 characters",
                )
    # Never echo the reference: a malformed one is often the secret pasted in by mistake.
    raise CredentialError(
        Code.UNKNOWN_CREDENTIAL,
        f"credential reference must be {REFERENCE_FORMS}",
    )


def systemd_name_valid(name: str) -> bool:
    """Whether ``name`` can name a credential in ``$CREDENTIALS_DIRECTORY``: systemd's own
    rule (``credential_name_valid``: a file name -- not empty, no ``/``, not ``.`` or ``..`` --
    and an fd name -- printable ASCII, no ``:``, at most 255 characters), so that the
    ``LoadCredential=NAME:...`` the start suggests names this credential and no other."""
    return (
        name not in ("", ".", "..")
        and len(name) <= 255
        and all(" " <= c <= "~" and c not in "/:" for c in name)
    )


def systemd_path(ref: str, name: str) -> Path:
    """Where ``systemd:NAME`` is: ``$CREDENTIALS_DIRECTORY/NAME`` -- the directory systemd
    makes for a unit with ``LoadCredential=`` (``/run/credentials/<unit>/``, a private
    read-only file system).  CREDENTIAL_MISSING when the variable is unset: the unit loads no
    credential (or the broker was not started by systemd)."""
    directory = os.environ.get(CREDENTIALS_DIRECTORY, "")
    if directory and not _absolute_normalised(directory):
        # systemd sets it so (its get_credentials_dir() refuses anything else): one that is not
        # was set by someone else, and would be read relative to the working directory.
        raise CredentialError(
            Code.CREDENTIAL_MISSING,
            "no systemd credentials are passed to the broker",
            ref=ref,
            detail=f"${CREDENTIALS_DIRECTORY} is not an absolute, normalised path, as systemd "
            "sets it: the broker was not started by a systemd unit with a credential -- start "
            f"it from one with LoadCredential={name}:/path/to/the/file",
        )
    if not directory:
        raise CredentialError(
            Code.CREDENTIAL_MISSING,
            "no systemd credentials are passed to the broker",
            ref=ref,
            detail=f"${CREDENTIALS_DIRECTORY} is not set: the broker was not started by a "
            f"systemd unit with a credential -- add LoadCredential={name}:/path/to/the/file "
            f"(or LoadCredentialEncrypted={name}:...) to the unit's [Service] section, or use "
            "file:PATH outside systemd",
        )
    return Path(directory) / name


def _absolute_normalised(path: str) -> bool:
    """systemd's ``path_is_absolute() && path_is_normalized()``: no ``.``/``..`` component, no
    ``//`` (a final ``/`` is allowed)."""
    parts = path.split("/")
    return path.startswith("/") and not any(p in (".", "..") for p in parts) and "//" not in path


def resolve(
    ref: str,
    *,
    vault: Vault | None,
    base_dir: Path | None = None,
    versioner: Versioner | None = None,
) -> Credential:
    """Fetch the secret a reference names (an ``env:`` or ``systemd:`` value's version by
    ``versioner``; a ``vault:`` one's by the vault's own key, ``Vault.entry``).
    Every failure is a ``CredentialError`` whose code says what the operator must fix:
    CREDENTIAL_MISSING (absent/empty), VAULT_LOCKED (unlock and retry), CREDENTIAL_INVALID
    (exists but unusable: unreadable, tampered vault, wrong key)."""
    kind, name = parse_ref(ref)
    if kind == "env":
        raw = os.environb.get(name.encode())
        if not raw:
            where = (
                "in the broker's environment (set it where the broker runs: `affidavit serve` "
                "or the embedded caller)"
            )
            raise CredentialError(
                Code.CREDENTIAL_MISSING,
                f"the environment variable is not set or empty {where}",
                ref=ref,
                detail=f"environment variable {name} is not set or empty {where}",
            )
        return Credential(ref, raw, _keyed_version(kind, ref, raw, versioner))
    if kind in ("file", "systemd"):
        path = Path(name)
        # A relative path is read from the config file's directory, not the working one: say
        # which file that was, or the operator looks for it where it is not.
        where = ""
        create = "create it (mode 0600, the broker's user's) or name another file"
        if kind == "systemd":
            path = systemd_path(ref, name)
            where = f" (read as {path}: the unit's credentials directory)"
            create = f"add LoadCredential={name}:/path/to/the/file to the unit, or name another"
        elif not path.is_absolute() and base_dir is not None:
            path = base_dir / path
            where = f" (read as {path}: relative to the config file's directory)"
        try:
            data, st = read_small_file(path, MAX_CREDENTIAL_BYTES, private=True, credential=True)
        except FileMissing as exc:
            raise CredentialError(
                Code.CREDENTIAL_MISSING,
                exc.public,
                ref=ref,
                detail=f"{exc}{where}: {create} in the target's credential",
            ) from None
        except FileRefused as exc:
            # The reason names the file's type, size or the OS's error -- never its contents.
            raise CredentialError(
                Code.CREDENTIAL_INVALID, exc.public, ref=ref, detail=f"{exc}{where}"
            ) from None
        data = trim_final_newline(data)
        if not data:
            raise CredentialError(
                Code.CREDENTIAL_MISSING,
                "file is empty",
                ref=ref,
                detail=f"file {path} is empty: write the credential into it",
            )
        # Not the size: the version is in the record a caller reads, and a single-line file's
        # size is the secret's length.  ctime moves with every write (and with a utime that
        # puts mtime back), the inode with a replacing rename.
        if kind == "systemd":
            # systemd writes a fresh copy at every start of the unit: its inode and times
            # would make every restart a new version (an approval granted before it stale),
            # so the value decides, as for env:.
            return Credential(ref, data, _keyed_version(kind, ref, data, versioner))
        return Credential(ref, data, f"{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}")
    # vault
    if vault is None:
        raise CredentialError(
            Code.CREDENTIAL_MISSING,
            "no vault is configured",
            ref=ref,
            detail="no vault is configured: set [vault] path, then `affidavit vault init` and "
            f"`affidavit vault put {name}` as the broker's user",
        )
    try:
        value, version, digester = vault.entry(name)
    except VaultLocked as exc:
        # The vault's errors name its file: for the operator only.
        raise CredentialError(
            Code.VAULT_LOCKED,
            "the vault is locked (`affidavit vault unlock` as the broker's user)",
            ref=ref,
            detail=str(exc),
        ) from None
    except EntryMissing as exc:
        raise CredentialError(
            Code.CREDENTIAL_MISSING,
            "no vault entry with that name",
            ref=ref,
            detail=f"{exc} (store it: `affidavit vault put {name}` as the broker's user)",
        ) from None
    except VaultMissing as exc:
        raise CredentialError(
            Code.CREDENTIAL_MISSING, "the vault file does not exist", ref=ref, detail=str(exc)
        ) from None
    except (VaultCorrupt, VaultError) as exc:
        # Seed: "a local key decryption error" stays preflight, with its own code.
        raise CredentialError(
            Code.CREDENTIAL_INVALID,
            "the vault cannot be read or decrypted (the operator's record has the reason)",
            ref=ref,
            detail=str(exc),
        ) from None
    if not value:
        raise CredentialError(
            Code.CREDENTIAL_MISSING,
            "vault entry is empty",
            ref=ref,
            detail=f"vault entry is empty (store the value: `affidavit vault put {name}`)",
        )
    # The entry's counter alone repeats with another value in a re-created or restored vault
    # (an approval granted for token A would match token B): a keyed digest of the value says
    # which value it is; the counter stays in front for `vault list`.  Keyed by the vault's own
    # key, not ``versioner`` (the journal's): the journal key's holders need not hold the
    # passphrase, and with it they could test guesses at the value at HMAC speed.
    return Credential(ref, value, f"{version}:{_keyed_version(kind, ref, value, digester)}")


# --- injection --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Injection:
    """What the adapter adds to the request.  ``headers`` and ``query`` carry the secret, so an
    ``Injection`` must never be logged or journaled; ``header_names``/``query_param`` may be.

    ``query`` values are already percent-encoded (RFC 3986 §2.1, every reserved character
    escaped); use ``apply_query`` to append them to a request target."""

    headers: tuple[tuple[str, str], ...]
    query: tuple[tuple[str, str], ...]
    header_names: frozenset[str]
    query_param: str | None

    def __repr__(self) -> str:
        return (
            f"Injection(header_names={sorted(self.header_names)!r}, "
            f"query_param={self.query_param!r}, values=<redacted>)"
        )

    __str__ = __repr__


def parse_inject(scheme: str) -> tuple[str, str | None]:
    """Validate an injection scheme: ``("bearer"|"basic", None)`` or ``("header"|"query", NAME)``.
    Raises ``ValueError`` with a human message (the config loader adds the field path)."""
    if scheme in ("bearer", "basic"):
        return scheme, None
    kind, sep, name = scheme.partition(":") if isinstance(scheme, str) else ("", "", "")
    if sep and kind == "header":
        if not _TOKEN.fullmatch(name):
            raise ValueError("header:NAME needs an RFC 9110 token as NAME")
        if name.lower() in _RESERVED_HEADERS:
            raise ValueError(f"header:{name} is owned by the transport and cannot carry a secret")
        return kind, name
    if sep and kind == "query":
        if not _QUERY_NAME.fullmatch(name):
            raise ValueError("query:NAME needs NAME of A-Z a-z 0-9 _ . - ~ (1-128 characters)")
        return kind, name
    raise ValueError("must be bearer, basic, header:NAME or query:NAME")


def _header_safe(value: bytes, ref: str) -> str:
    # RFC 9110 §5.5: field values are visible characters with inner spaces; CR/LF/NUL would
    # let the secret's owner (or an attacker who planted it) inject headers.
    try:
        text = value.decode("ascii")
    except UnicodeDecodeError:
        raise CredentialError(
            Code.CREDENTIAL_INVALID, "value is not ASCII and cannot go in a header", ref=ref
        ) from None
    # (For ASCII, ``isprintable`` is exactly "no character below space, and no DEL".)
    if not text or text != text.strip() or not text.isprintable():
        raise CredentialError(
            Code.CREDENTIAL_INVALID,
            "value has control characters or surrounding whitespace",
            ref=ref,
        )
    return text


def inject_http(scheme: str, credential: Credential) -> Injection:
    """Build the injection for ``scheme``.  A bad value is CREDENTIAL_INVALID (phase
    credential_injection): nothing has been sent yet, so the outcome stays not_attempted."""
    try:
        kind, name = parse_inject(scheme)
    except ValueError as exc:
        raise CredentialError(Code.CREDENTIAL_INVALID, f"injection scheme: {exc}") from None
    ref = credential.ref
    if kind == "bearer":
        token = _header_safe(credential.value, ref)
        if " " in token:
            raise CredentialError(Code.CREDENTIAL_INVALID, "a bearer token has no spaces", ref=ref)
        return Injection(
            (("Authorization", f"Bearer {token}"),), (), frozenset({"authorization"}), None
        )
    if kind == "basic":
        # RFC 7617: user-id ":" password, user-id without a colon; sent base64 (UTF-8).
        if b":" not in credential.value or credential.value.startswith(b":"):
            raise CredentialError(
                Code.CREDENTIAL_INVALID,
                "basic credentials must have the form user:password",
                ref=ref,
            )
        if any(b < 0x20 or b == 0x7F for b in credential.value):
            raise CredentialError(Code.CREDENTIAL_INVALID, "value has control characters", ref=ref)
        encoded = base64.b64encode(credential.value).decode("ascii")
        return Injection(
            (("Authorization", f"Basic {encoded}"),), (), frozenset({"authorization"}), None
        )
    assert name is not None
    if kind == "header":
        value = _header_safe(credential.value, ref)
        return Injection(((name, value),), (), frozenset({name.lower()}), None)
    quoted = urllib.parse.quote_from_bytes(credential.value, safe="")
    return Injection((), ((name, quoted),), frozenset(), name)


def apply_query(target: str, injection: Injection) -> str:
    """Append the injected query parameters to a request target (``/path?x=1`` or ``/path``)."""
    if not injection.query:
        return target
    extra = "&".join(f"{k}={v}" for k, v in injection.query)
    if "?" not in target:
        return f"{target}?{extra}"
    return f"{target}{extra}" if target.endswith(("?", "&")) else f"{target}&{extra}"
