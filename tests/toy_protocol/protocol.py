"""The toy protocol's declarations: its table, target schema, action and binding.

A line protocol over TCP, small enough to read whole, with the boundaries that matter:

    server: TOY 1              banner            (setup)
    client: AUTH <token>       the credential    (setup; nothing runs yet)
    server: OK | DENIED
    client: RUN <line>         DISPATCH boundary (the server acts on it)
    server: OUT <text>         zero or more result lines
    server: END <status>       the result is complete (0: ok, else failed)

Everything the service needs is declared here and found through ``PROTOCOL`` (the package's
entry point); nothing outside ``tests/toy_protocol/`` names this protocol.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

from affidavit.adapters.base import AttemptContext, RemoteResult
from affidavit.protocols import ActionSpec, Prepared, ProtocolSpec
from affidavit.protocols.actions import ActionInvalid, session, string
from affidavit.schema import COMMON, Field, TargetSchema, Timeouts, host_setting
from affidavit.secrets.credentials import Credential, CredentialError
from affidavit.statemachine import Code, ProtocolTable

from .driver import ToyRequest, perform

TOY_TABLE = ProtocolTable(
    name="toy",
    initial="idle",
    states={
        "idle": "nothing done yet",
        "connected": "TCP connected, no banner yet",
        "greeted": "the server's banner arrived",
        "ready": "authenticated; setup is complete, nothing requested yet",
        "setup_failed": "stopped before dispatch: the line was never sent",
        "running": "DISPATCH boundary crossed (journaled); the RUN line is being written",
        "receiving": "result lines are arriving",
        "complete": "END arrived: the result is complete",
        "interrupted": "stopped after dispatch without END (close, timeout, garbage)",
    },
    transitions={
        "idle": {"connected": "connected", "connect_failed": "setup_failed"},
        "connected": {"greeted": "greeted", "close": "setup_failed"},
        "greeted": {"auth_ok": "ready", "auth_denied": "setup_failed", "close": "setup_failed"},
        "ready": {"run": "running"},
        "running": {"out": "receiving", "end": "complete", "close": "interrupted"},
        "receiving": {"out": "receiving", "end": "complete", "close": "interrupted"},
    },
    dispatch=frozenset({("ready", "run")}),
    completes=frozenset({("running", "end"), ("receiving", "end")}),
    final=frozenset({"setup_failed", "complete", "interrupted"}),
    milestones={"running": "REQUEST_SENT", "receiving": "REMOTE_RESPONSE_STARTED"},
    doc="banner, AUTH, RUN (dispatch), OUT lines, END (complete)",
)


# --- target ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToyTarget:
    name: str
    host: str
    port: int
    credential: str
    budget: int
    timeout: Timeouts
    max_result: int | None
    idempotent_lines: frozenset[str]
    trust_file: Path | None = None
    """A file naming whom the toy trusts (a trust anchor: what a CA bundle is to HTTP); the
    driver reads nothing from it -- it shows that a declared anchor is checked at start."""
    kind: Literal["toy"] = "toy"


TOY_TARGET = TargetSchema(
    "toy",
    ToyTarget,
    (
        Field("host", host_setting, default="127.0.0.1", doc="server address"),
        Field("port", lambda r: r.integer(1, 65535), doc="TCP port"),
        *COMMON,
        Field(
            "idempotent_lines",
            lambda r: frozenset(r.string_list()),
            default=[],
            doc="lines this server documents as safe to repeat",
        ),
        Field(
            "trust_file",
            lambda r: r.resolve_path(r.string()) if r.present else None,
            default=None,
            unset_omitted=True,
            doc="a file naming whom the toy trusts",
            trust_anchor="toy trust file",
        ),
    ),
)


# --- action ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToyAction:
    target: str
    line: str
    session: str | None
    kind: ClassVar[str] = "toy"


def _parse(obj: Mapping[str, Any], name: str, target: ToyTarget) -> ToyAction:
    line = string(obj, "line", required=True)
    assert line is not None
    if not line.isascii() or not line.isprintable() or len(line) > 200:
        raise ActionInvalid(Code.INVALID_FIELD, "line", "must be 1-200 printable ASCII characters")
    return ToyAction(target=name, line=line, session=session(obj))


TOY_ACTION = ActionSpec(
    fields=frozenset({"line"}),
    parse=_parse,
    fingerprint=lambda a, t: {"line_sha256": hashlib.sha256(a.line.encode()).hexdigest()},
    idempotent=lambda a, t: a.line in t.idempotent_lines,
)


# --- binding ---------------------------------------------------------------------------------


class ToyBinding:
    kind = "toy"
    table = TOY_TABLE

    def start_warnings(self, targets: Sequence[ToyTarget]) -> list[str]:
        return []

    def connect_timeout(self, target: ToyTarget) -> float:
        return target.timeout.connect

    def prepare(
        self,
        action: ToyAction,
        target: ToyTarget,
        credential: Credential,
        key: str | None,
        trusted: Mapping[str, str],
    ) -> Prepared:
        token = credential.value
        if not token or any(b < 0x21 or b > 0x7E for b in token):
            raise CredentialError(Code.CREDENTIAL_INVALID, "a toy token is visible ASCII")
        request = ToyRequest(target.host, target.port, token, action.line.encode(), target.timeout)
        return Prepared(request, (token,), {"inject": "auth-line"})

    async def perform(self, prepared: Prepared, ctx: AttemptContext) -> RemoteResult:
        return await perform(prepared.request, ctx)

    async def aclose(self) -> None:
        return None


PROTOCOL = ProtocolSpec(
    kind="toy", target=TOY_TARGET, action=TOY_ACTION, binding=ToyBinding, table=TOY_TABLE
)
