"""What a protocol brings to the service, as one value: ``ProtocolSpec``.

A protocol is its target schema (config keys and validation, ``affidavit.schema``), its action
schema (the caller's JSON fields, their parser, and what identifies a request: fingerprint and
idempotency by configuration), its binding to an adapter, and its protocol table.  Config loading,
action parsing, the engine, the diagrams and the model checks all reach a protocol through this
value; see ``affidavit.protocols.registry`` for how specs are found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

from affidavit.adapters.base import AttemptContext, RemoteResult
from affidavit.schema import TargetSchema
from affidavit.statemachine import Code, ProtocolTable

__all__ = [
    "MIN_POLL_INTERVAL",
    "Action",
    "ActionField",
    "ActionSpec",
    "Binding",
    "Prepared",
    "ProtocolSpec",
    "Reading",
    "ReconcileContract",
    "ResultContracts",
    "text_payload",
]


class Action(Protocol):
    """What the service reads of any parsed action."""

    kind: ClassVar[str]

    @property
    def target(self) -> str: ...
    @property
    def session(self) -> str | None: ...


@dataclass(frozen=True)
class ActionField:
    """One field of an action as callers see it, declared beside the parser that enforces it
    and from the parser's own constants.  The JSON Schema an interface publishes (the MCP
    tools' input schemas, ``affidavit.protocols.catalog``) is derived from these declarations,
    and tests/mcp/test_schema_agreement.py proves the two agree: whatever the schema accepts,
    the parser accepts or refuses with one of the field's ``checks``."""

    name: str
    doc: str
    type: Literal["string", "object"] = "string"
    required: bool = False
    max_length: int | None = None
    """Characters (an object: properties) the parser accepts at most, whatever the target."""
    limit: Callable[[Any], int] | None = None
    """A bound each target sets (``max_body``): the schema publishes the largest over the
    targets offered; a target's own is one of the ``checks``."""
    pattern: str | None = None
    """A regular expression the whole value must match (Python ``re.fullmatch``; written in the
    common subset of Python and ECMA-262, published as ``^(?:pattern)$``)."""
    keys: ActionField | None = None
    """An object's property names."""
    values: ActionField | None = None
    """An object's property values."""
    checks: tuple[tuple[Code, str], ...] = ()
    """Refusals the schema cannot say -- they depend on the target, on another field or on
    meaning rather than form -- each with the code the parser gives it."""


def text_payload(name: str, doc: str, setting: str) -> ActionField:
    """A payload given as text and sent as its UTF-8 bytes, bounded by the target's ``setting``
    (``max_body``, ``max_stdin``): characters in the schema, bytes (and valid text) beyond it."""
    return ActionField(
        name,
        doc,
        limit=lambda target: int(getattr(target, setting)),
        checks=(
            (Code.PAYLOAD_LIMIT, f"more UTF-8 bytes than this target's {setting}"),
            (Code.INVALID_FIELD, "not valid Unicode text"),
        ),
    )


@dataclass(frozen=True)
class ActionSpec:
    """The caller's side of a protocol."""

    fields: frozenset[str]
    """The action's JSON fields besides the common ``target`` and ``session``.  A field another
    protocol accepts is UNSUPPORTED_ACTION here; any other unknown field is INVALID_FIELD."""
    parse: Callable[[Mapping[str, Any], str, Any], Action]
    """``(action object, target name, target) -> action``; raises ``ActionInvalid`` only.  Runs
    after the common checks (an object, a configured target, no foreign fields) and must read
    ``session`` last with ``affidavit.protocols.actions.session``."""
    fingerprint: Callable[[Any, Any], Mapping[str, Any]]
    """``(action, target) -> JSON-able request identity``: what is sent, without secrets and
    without the session.  The target snapshot hash is added by the service."""
    idempotent: Callable[[Any, Any], bool]
    """``(action, target) -> bool``: safe to repeat *by the target's configuration*, never by a
    method's or command's name (seed: "The method name serves as evidence, but not as a
    guarantee")."""
    schema: tuple[ActionField, ...] = ()
    """``fields`` declared one by one, for the published schemas; a protocol without them gets
    a schema that names its fields and leaves their form to its parser."""
    tool: str = ""
    """The MCP tool's name (``http_request``); default ``<kind>_call``."""
    doc: str = ""
    """What one action does, in a line or two (the tool's description starts with it)."""

    def __post_init__(self) -> None:
        declared = [f.name for f in self.schema]
        if self.schema and (len(set(declared)) != len(declared) or set(declared) != self.fields):
            raise ValueError(f"the action schema declares {declared}, the fields are {self.fields}")

    needs_approval: Callable[[Any, Any], bool] | None = None
    """``(action, target) -> bool``: whether the target's ``approval`` setting covers the action
    (HTTP: its method; SSH: its command).  None: only ``approval = "always"`` does."""
    operator_view: Callable[[Any, Any], Mapping[str, Any]] | None = None
    """``(action, target) -> JSON-able``: what an operator approves -- what will be sent and
    where, never a credential (it is sealed in the journal).  None: the fingerprint's
    identity."""
    operator_contents: Callable[[Mapping[str, Any]], Mapping[str, bytes]] | None = None
    """``(accepted action) -> {name: exact bytes}``: each content the operator view names (``X``
    with ``X_bytes`` and ``X_sha256``: an HTTP body, SSH stdin), read from the action as the
    broker sealed it with ACTION_ACCEPTED (the caller's JSON; no credential is in it), so an
    operator can fetch whole what the view keeps only when small.  Raises ``ValueError`` when
    the action does not hold it readably; whoever serves it checks the bytes against the view's
    ``X_sha256`` first.  None: no content can be fetched."""


@dataclass
class Prepared:
    """A request ready for the adapter, plus what must never leave the broker."""

    request: Any
    secrets: tuple[bytes, ...] = field(repr=False)
    """Exact injected values (and their encodings) to redact from stored/returned results."""
    evidence: Mapping[str, Any]
    """Secret-free facts about the injection, e.g. {"inject": "bearer", "idempotency_header": …}."""


class Binding(Protocol):
    """Turns a validated action, its target and a resolved credential into one adapter attempt."""

    kind: str
    table: ProtocolTable

    def prepare(
        self,
        action: Any,
        target: Any,
        credential: Any,
        idempotency_key: str | None,
        trusted: Mapping[str, str],
    ) -> Prepared:
        """Build the adapter request.  Raises ``CredentialError`` if the credential cannot be
        used (credential_injection phase) — before any connection exists.  ``trusted``: each
        file the target trusts (``Field.trust_anchor``, by path) -> the ``sha256:`` of the
        bytes the call's recorded account was computed from; the adapter trusts those bytes
        or refuses the call before sending anything."""
        ...

    def connect_timeout(self, target: Any) -> float: ...

    def start_warnings(self, targets: Sequence[Any]) -> list[str]:
        """Words for the operator's log at a broker's start about ``targets`` (this kind's):
        what the environment asks that the binding ignores, what will make every call fail.
        Optional: a binding without it says nothing at the start."""
        ...

    async def perform(self, prepared: Prepared, ctx: AttemptContext) -> RemoteResult: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class Reading:
    """What a complete result establishes beyond its own outcome."""

    operation: Mapping[str, Any] | None = None
    """A job it accepted, to be tracked as an operation: ``{"job_id", "status_url",
    "status_path"}`` (each may be None when the result did not say)."""
    items: Sequence[Mapping[str, Any]] | None = None
    """A batch's items, one per item sent, in order: ``{"id", "outcome", "code", "retry"}``
    plus the item's own ``status`` when it had one."""


MIN_POLL_INTERVAL = 1.0
"""Seconds, unless its target says, from one poll of an operation that reaches the remote to the
next: each adds a row or two to its submission's record and is an invocation of its own, so the
record grows by at most a poll per interval of the job's life (audit 50: a caller polling
without pause grew it past what the daemon answers whole).  A poll sooner is answered
``POLL_TOO_SOON`` with when to poll again, nothing asked or written."""


@dataclass(frozen=True)
class ResultContracts:
    """How a protocol reads the remote's contracts for asynchronous jobs and for batches (seed:
    "A complete HTTP 202 response confirms that the job was accepted, not that the queued work
    was completed"; "A batch request needs an outcome for each item").  Optional: a protocol
    without them has neither operations nor batches.  Each function is pure and never sees a
    secret (bodies are the redacted bytes the journal stores)."""

    batch: Callable[[Any, Any], Mapping[str, Any] | None]
    """``(action, target) -> {"items": [id, ...], "atomic": bool}`` when the target declares
    batches and the action sends one, else None.  Bound to the invocation when it is accepted,
    so the items are known whatever happens after dispatch.  Raises ``ActionInvalid`` (code and
    field path) for a batch whose items the results could not be matched to: ``parse_action``
    calls it before anything is recorded."""
    read: Callable[[Any, Any, RemoteResult, bytes | None], Reading]
    """``(action, target, result, body) -> Reading`` of a complete result (``body`` None: too
    large to have been kept in memory, and not read)."""
    poll: Callable[[Any, Mapping[str, Any]], Mapping[str, Any]]
    """``(target, operation) -> action`` that queries the job's status resource on the same
    target; ``ValueError`` (its message for the operator) when there is none to query."""
    poll_state: Callable[[Any, Mapping[str, Any], bytes | None], tuple[str | None, Any]]
    """``(target, summary, body) -> (state, remote_status)`` from the status resource's
    complete answer without an error: ``pending``, ``succeeded`` or ``failed``, or None when
    it names none."""
    min_poll_interval: Callable[[Any], float] = lambda _target: MIN_POLL_INTERVAL
    """``target -> seconds``: the least time between two polls of an operation on it that reach
    the remote (each adds rows to its submission's record); a poll sooner is refused
    ``POLL_TOO_SOON``, nothing asked.  ``MIN_POLL_INTERVAL`` unless the protocol says (HTTP:
    ``operations.min_poll_interval``)."""


@dataclass(frozen=True)
class ReconcileContract:
    """How a protocol settles an unknown outcome by querying the remote (seed: "Query the remote
    state by a stable identifier, reconcile it").  Optional: without it, only an operator's
    attestation reconciles."""

    query: Callable[[Any, Mapping[str, str | None]], Mapping[str, Any]]
    """``(target, bound values) -> action``: the target's configured query with its
    placeholders filled (``affidavit.protocols.placeholders``); ``ValueError`` (for the
    operator) when the target has none or a value it names is missing."""
    verdict: Callable[
        [Any, Mapping[str, Any], Mapping[str, bytes], Mapping[str, str | None]],
        tuple[Any, str | None],
    ]
    """``(target, stored summary, stored streams, bound values) -> (Outcome.COMMITTED |
    Outcome.REJECTED | None, what matched)`` from the query's own complete, authoritative
    result; the bound values are those ``query`` filled its placeholders with (a condition may
    compare an echo of the idempotency key to them)."""
    settle: Callable[[Any], float]
    """``target -> seconds``: how long after an attempt ended the query must have been sent
    for an absent finding to settle it (``affidavit.protocols.settle``)."""


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol, registered under ``kind`` (the targets' ``kind = "…"``)."""

    kind: str
    target: TargetSchema[Any]
    action: ActionSpec
    binding: Callable[[], Binding]
    """Called once per broker; the instance keeps its pools until ``aclose()``."""
    table: ProtocolTable
    """The protocol machine's table: registered for the diagrams and the model checks, and the
    one the binding's driver runs."""
    contracts: ResultContracts | None = None
    """Operations and batches, if the protocol has them (``ResultContracts``)."""
    describe: Callable[[Any], Mapping[str, Any]] | None = None
    """``target -> JSON`` a caller may know of a target (``list_targets``): what it allows,
    what it declares idempotent, its idempotency contract.  Listed field by field, never a
    credential reference, a key or a path on the broker's host."""
    reconcile: ReconcileContract | None = None
    """The reconciliation query, if the protocol has one (``ReconcileContract``)."""

    def __post_init__(self) -> None:
        if self.target.kind != self.kind:
            raise ValueError(f"protocol {self.kind!r} has a target schema of {self.target.kind!r}")
