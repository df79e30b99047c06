"""The public contract: closed enumerations and the closed set of error codes.

Seed, "Cause and outcome answer different questions": every error carries a *phase* (where the
broker stopped — for the operator), an *outcome* (what may already have happened remotely — for
the caller) and a *retry* hint (what automation may do now).  They are independent facts, so they
are independent enums.  Callers branch on these values; the ``message`` text is for humans only.

Everything here is closed: adding a value is a contract change that must update ``docs/`` (the
contract doc is generated from this module and a test fails when it drifts).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "CODES",
    "Code",
    "CodeInfo",
    "EvidenceSource",
    "Outcome",
    "Phase",
    "Retry",
]


class Phase(StrEnum):
    """Where the broker stopped.  For diagnosis, never for retry policy."""

    VALIDATION = "validation"
    """The broker rejected the action before selecting or using a secret."""
    CREDENTIAL_INJECTION = "credential_injection"
    """The broker could not obtain, resolve, approve or inject the credential."""
    CONNECTION_SETUP = "connection_setup"
    """Name resolution, TCP, TLS, SSH transport, host verification or remote auth failed."""
    REMOTE_EXECUTION = "remote_execution"
    """The operation was dispatched; the broker waits for, or has, the remote result."""
    RESULT_DELIVERY = "result_delivery"
    """The broker recorded the remote result but could not fully deliver it."""


class Outcome(StrEnum):
    """What the durable records prove about the remote operation."""

    NOT_ATTEMPTED = "not_attempted"
    """Durable evidence shows the operation did not cross the dispatch boundary."""
    REJECTED = "rejected"
    """A complete, authoritative rejection was received; the remote did not claim success."""
    COMMITTED = "committed"
    """A complete, authoritative result was received (not necessarily a success)."""
    UNKNOWN = "unknown"
    """Dispatch may have happened and no complete result determines the outcome."""


class Retry(StrEnum):
    """What automation may do now, derived from evidence — never from an exception's text."""

    NEVER = "never"
    """Do not retry this invocation: use the recorded result, or an operator must act."""
    AFTER_CORRECTION = "after_correction"
    """Retrying the same request cannot help; fix the request, configuration or credential."""
    BACKOFF = "backoff"
    """A new attempt is safe after a delay (nothing was dispatched, or the operation is
    idempotent / the remote asked to slow down and the retry is safe)."""
    SAME_IDEMPOTENCY_KEY = "same_idempotency_key"
    """Retry only with the recorded idempotency key and an identical request fingerprint."""
    RECONCILE = "reconcile"
    """Query the remote state by a stable identifier before any new action."""
    FETCH_RESULT = "fetch_result"
    """The result is stored under the invocation id: fetch it, never re-run the action."""


class EvidenceSource(StrEnum):
    """How the broker knows what an event claims (seed: "a stated source of confidence")."""

    TRANSPORT_OBSERVED = "transport_observed"
    """The broker's own transport saw it (bytes handed over, socket closed, ...)."""
    REMOTE_RESPONSE = "remote_response"
    """A complete, authenticated response on the original connection."""
    REMOTE_QUERY = "remote_query"
    """A later query of the remote system by a stable identifier (reconciliation)."""
    OPERATOR_ATTESTED = "operator_attested"
    """A human inspected the remote system and attested the outcome."""


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """Documentation of one error code: where it arises and what it usually means."""

    phase: Phase
    outcome: Outcome
    retry: Retry
    """The default hint.  The projection may refine it from evidence (idempotency, budget...)."""
    meaning: str
    before_dispatch: Retry | None = None
    """Set for a *stop cause* (the caller went away, the broker shut down): such a code may also
    end an attempt before its dispatch gate, recorded by SETUP_FAILED -- phase
    connection_setup, outcome not_attempted -- with this hint.  Seed, "Cause and outcome answer
    different questions": the code names the cause; where it struck decides the outcome."""
    when_idempotent: Retry | None = None
    """For an ``unknown`` code: the hint an operation configured idempotent gets instead of
    ``backoff`` (and whatever its budget) -- set where the evidence itself proves that the
    identical request, sent again, meets the same end, so a resend after a delay is no path out
    (RESULT_SIZE_LIMIT: the remote was sending a result larger than ``max_result``; the limit
    or the request must change first).  A non-idempotent operation gets ``reconcile``, whatever
    its idempotency key: the remote may have acted, and a same-key resend gets back the result
    the remote stored for the key (seed: the remote must "store the first definite result ...
    and return it on a retry") -- the same one past the limit."""
    pending: bool = False
    """A code of an invocation that has not finished (IN_PROGRESS, APPROVAL_PENDING): shown while
    its record rests in a non-final state; the hint is always ``fetch_result``."""


class Code(StrEnum):
    """Closed set of stable machine codes.  See ``CODES`` for phase, outcome and meaning."""

    # validation
    INVALID_TARGET = "INVALID_TARGET"
    UNSUPPORTED_ACTION = "UNSUPPORTED_ACTION"
    PAYLOAD_LIMIT = "PAYLOAD_LIMIT"
    MISSING_FIELD = "MISSING_FIELD"
    INVALID_FIELD = "INVALID_FIELD"
    FORBIDDEN_HEADER = "FORBIDDEN_HEADER"
    UNKNOWN_CREDENTIAL = "UNKNOWN_CREDENTIAL"
    APPROVAL_STALE = "APPROVAL_STALE"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    CONFIG_CHANGED = "CONFIG_CHANGED"
    IDEMPOTENCY_MISMATCH = "IDEMPOTENCY_MISMATCH"
    # credential injection
    CREDENTIAL_MISSING = "CREDENTIAL_MISSING"
    CREDENTIAL_INVALID = "CREDENTIAL_INVALID"
    VAULT_LOCKED = "VAULT_LOCKED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_PENDING = "APPROVAL_PENDING"
    APPROVAL_LIMIT = "APPROVAL_LIMIT"
    # connection setup
    DNS_FAILED = "DNS_FAILED"
    CONNECTION_REFUSED = "CONNECTION_REFUSED"
    CONNECT_TIMEOUT = "CONNECT_TIMEOUT"
    TLS_FAILED = "TLS_FAILED"
    CERTIFICATE_INVALID = "CERTIFICATE_INVALID"
    HOST_KEY_MISMATCH = "HOST_KEY_MISMATCH"
    REMOTE_AUTH_FAILED = "REMOTE_AUTH_FAILED"
    PROXY_FAILED = "PROXY_FAILED"
    SETUP_FAILED = "SETUP_FAILED"
    LEASE_LOST = "LEASE_LOST"
    # remote execution
    REMOTE_OUTCOME_UNKNOWN = "REMOTE_OUTCOME_UNKNOWN"
    REMOTE_RESULT_INCOMPLETE = "REMOTE_RESULT_INCOMPLETE"
    RESULT_SIZE_LIMIT = "RESULT_SIZE_LIMIT"
    CALLER_CANCELLED = "CALLER_CANCELLED"
    BROKER_SHUTDOWN = "BROKER_SHUTDOWN"
    REMOTE_REJECTED = "REMOTE_REJECTED"
    REMOTE_THROTTLED = "REMOTE_THROTTLED"
    REMOTE_ERROR = "REMOTE_ERROR"
    REMOTE_REDIRECTED = "REMOTE_REDIRECTED"
    REMOTE_COMMAND_FAILED = "REMOTE_COMMAND_FAILED"
    EXEC_REJECTED = "EXEC_REJECTED"
    RETRY_BUDGET_EXHAUSTED = "RETRY_BUDGET_EXHAUSTED"
    IN_PROGRESS = "IN_PROGRESS"
    # result delivery
    RESULT_STORE_FAILED = "RESULT_STORE_FAILED"
    RESULT_DELIVERY_FAILED = "RESULT_DELIVERY_FAILED"

    @property
    def info(self) -> CodeInfo:
        return CODES[self]


_V, _CI, _CS, _RE, _RD = (
    Phase.VALIDATION,
    Phase.CREDENTIAL_INJECTION,
    Phase.CONNECTION_SETUP,
    Phase.REMOTE_EXECUTION,
    Phase.RESULT_DELIVERY,
)
_NA, _RJ, _CM, _UN = Outcome.NOT_ATTEMPTED, Outcome.REJECTED, Outcome.COMMITTED, Outcome.UNKNOWN

CODES: dict[Code, CodeInfo] = {
    Code.INVALID_TARGET: CodeInfo(
        _V, _NA, Retry.AFTER_CORRECTION, "The target is not configured or is malformed."
    ),
    Code.UNSUPPORTED_ACTION: CodeInfo(
        _V, _NA, Retry.AFTER_CORRECTION, "The method or action is not allowed for this target."
    ),
    Code.PAYLOAD_LIMIT: CodeInfo(
        _V, _NA, Retry.AFTER_CORRECTION, "The request body or a field exceeds a configured limit."
    ),
    Code.MISSING_FIELD: CodeInfo(
        _V, _NA, Retry.AFTER_CORRECTION, "A required field of the action is absent."
    ),
    Code.INVALID_FIELD: CodeInfo(
        _V, _NA, Retry.AFTER_CORRECTION, "A field of the action has the wrong type or form."
    ),
    Code.FORBIDDEN_HEADER: CodeInfo(
        _V,
        _NA,
        Retry.AFTER_CORRECTION,
        "The caller tried to set a credential-bearing header the broker owns.",
    ),
    Code.UNKNOWN_CREDENTIAL: CodeInfo(
        _V, _NA, Retry.AFTER_CORRECTION, "The target names a credential reference of unknown form."
    ),
    Code.APPROVAL_STALE: CodeInfo(
        _V,
        _NA,
        Retry.AFTER_CORRECTION,
        "The request fingerprint changed after approval (request, credential version or target"
        " configuration), or the operator who granted it is no longer one; nothing was sent"
        " under the old approval, a new invocation needs a new approval.",
    ),
    Code.APPROVAL_EXPIRED: CodeInfo(
        _V,
        _NA,
        Retry.AFTER_CORRECTION,
        "The approval window ran out before the request was dispatched; nothing was sent, a new"
        " invocation needs a new approval.",
    ),
    Code.CONFIG_CHANGED: CodeInfo(
        _V,
        _NA,
        Retry.AFTER_CORRECTION,
        "The target configuration changed between validation and dispatch (start a new"
        " invocation), or since this idempotency key was bound to this same request:"
        " `evidence.idempotency.bound_to` names the invocation it is bound to -- fetch or"
        " reconcile that one (a new key would send the request again unless its record says"
        " it was rejected or never sent).",
    ),
    Code.IDEMPOTENCY_MISMATCH: CodeInfo(
        _V,
        _NA,
        Retry.AFTER_CORRECTION,
        "The idempotency key was already bound in its scope to a different request (method,"
        " path, headers, body; command, stdin; or another target declaring the same scope):"
        " correct the request, or use a new key for a new one.",
    ),
    Code.CREDENTIAL_MISSING: CodeInfo(
        _CI, _NA, Retry.AFTER_CORRECTION, "The referenced secret does not exist or is empty."
    ),
    Code.CREDENTIAL_INVALID: CodeInfo(
        _CI,
        _NA,
        Retry.AFTER_CORRECTION,
        "The secret exists but cannot be used (key import/decryption failed, bad form).",
    ),
    Code.VAULT_LOCKED: CodeInfo(
        _CI, _NA, Retry.AFTER_CORRECTION, "The vault is locked; unlock it, then retry."
    ),
    Code.APPROVAL_DENIED: CodeInfo(
        _CI, _NA, Retry.NEVER, "A human denied this invocation; it must not be retried."
    ),
    Code.APPROVAL_PENDING: CodeInfo(
        _CI,
        _NA,
        Retry.FETCH_RESULT,
        "A human approval is pending; nothing was sent.  The result will be stored under this"
        " invocation id: fetch it later, never send the action again.",
        pending=True,
    ),
    Code.APPROVAL_LIMIT: CodeInfo(
        _CI,
        _NA,
        Retry.BACKOFF,
        "Too many requests of this caller (its uid) already await an operator's decision"
        " ([service] max_pending_approvals); nothing was recorded for approval and nothing was"
        " sent.  Retry once some of them are decided or expire (with the same idempotency key"
        " too: it retries this invocation, which then asks, counted like any request).",
    ),
    Code.DNS_FAILED: CodeInfo(_CS, _NA, Retry.BACKOFF, "The target host name did not resolve."),
    Code.CONNECTION_REFUSED: CodeInfo(
        _CS, _NA, Retry.BACKOFF, "The TCP connection was refused on a fresh connection."
    ),
    Code.CONNECT_TIMEOUT: CodeInfo(
        _CS, _NA, Retry.BACKOFF, "Connection setup did not finish within its timeout."
    ),
    Code.TLS_FAILED: CodeInfo(
        _CS, _NA, Retry.BACKOFF, "The TLS or SSH handshake failed before any request was sent."
    ),
    Code.CERTIFICATE_INVALID: CodeInfo(
        _CS,
        _NA,
        Retry.AFTER_CORRECTION,
        "The server certificate was rejected (untrusted, expired, wrong host).",
    ),
    Code.HOST_KEY_MISMATCH: CodeInfo(
        _CS, _NA, Retry.AFTER_CORRECTION, "The SSH host key differs from the pinned key."
    ),
    Code.REMOTE_AUTH_FAILED: CodeInfo(
        _CS, _NA, Retry.AFTER_CORRECTION, "The remote refused the broker's authentication."
    ),
    Code.PROXY_FAILED: CodeInfo(
        _CS, _NA, Retry.BACKOFF, "The proxy refused or failed to open a tunnel before dispatch."
    ),
    Code.SETUP_FAILED: CodeInfo(
        _CS, _NA, Retry.BACKOFF, "Connection setup failed for another transport reason."
    ),
    Code.LEASE_LOST: CodeInfo(
        _CS,
        _UN,
        Retry.FETCH_RESULT,
        "This worker's lease is no longer the invocation's (a newer attempt took it over, its "
        "attempt was closed by recovery or a reconciliation, or the lease ran out): it was "
        "stopped at a dispatch gate, or what it wrote after its dispatch was refused.  The "
        "answer is the record's phase and outcome, never another attempt's result as this "
        "caller's; fetch_result while the invocation runs or once a result is stored, else "
        "the record's own hint.",
    ),
    Code.REMOTE_OUTCOME_UNKNOWN: CodeInfo(
        _RE,
        _UN,
        Retry.RECONCILE,
        "The request may have been received; no complete response was recorded.",
    ),
    Code.REMOTE_RESULT_INCOMPLETE: CodeInfo(
        _RE,
        _UN,
        Retry.RECONCILE,
        "The remote result ended without a completion signal that proves it whole (framing cut "
        "short, malformed or ambiguous; exit status).",
    ),
    Code.RESULT_SIZE_LIMIT: CodeInfo(
        _RE,
        _UN,
        Retry.RECONCILE,
        "The remote result grew past the target's `max_result`: the broker stopped reading,"
        " closed the connection and returns nothing of it.  The remote may have run"
        " (`evidence.result_size_limit`: the limit and the bytes received -- or, for a result"
        " that echoed a secret or was not scanned whole, or of a target with a secret (whose"
        " answer cut short withholds its end), `received_withheld` (`redacted`,"
        " `short_redacted`, `tail_redacted` or `unscanned`) instead of any count:"
        " docs/redaction.md).  Sent again, the"
        " same request meets the same limit: an idempotent operation is hinted"
        " `after_correction` (raise `max_result` or ask for less); any other one `reconcile`,"
        " with an idempotency key too (the remote answers a same-key resend with the result it"
        " stored, the same one past the limit).",
        when_idempotent=Retry.AFTER_CORRECTION,
    ),
    Code.CALLER_CANCELLED: CodeInfo(
        _RE,
        _UN,
        Retry.RECONCILE,
        "The caller stopped waiting or hung up.  After dispatch the remote may still be running;"
        " before it, nothing was sent (connection_setup, not_attempted).",
        before_dispatch=Retry.BACKOFF,
    ),
    Code.BROKER_SHUTDOWN: CodeInfo(
        _RE,
        _UN,
        Retry.RECONCILE,
        "The broker shut down and its grace period ran out while the call was running.  After"
        " dispatch the remote may still be running; before it, nothing was sent"
        " (connection_setup, not_attempted).",
        before_dispatch=Retry.BACKOFF,
    ),
    Code.REMOTE_REJECTED: CodeInfo(
        _RE, _RJ, Retry.AFTER_CORRECTION, "The remote returned a complete, authoritative rejection."
    ),
    Code.REMOTE_THROTTLED: CodeInfo(
        _RE, _RJ, Retry.BACKOFF, "The remote asked the broker to slow down (429/503)."
    ),
    Code.REMOTE_ERROR: CodeInfo(
        _RE,
        _CM,
        Retry.RECONCILE,
        "The remote answered completely with a server error; it may have changed state first.",
    ),
    Code.REMOTE_REDIRECTED: CodeInfo(
        _RE,
        _CM,
        Retry.RECONCILE,
        "The complete answer is a redirect the broker did not follow: a 301, 302, 303, 307 or"
        " 308 -- `follow_redirects` is off, or `evidence.redirect_not_followed` (or"
        " `redirect_limit`) says why -- or any other 3xx (300, 305, 306, an unregistered one:"
        " never followed), a 304 included unless it answers a conditional GET or HEAD"
        " (If-None-Match, If-Modified-Since; RFC 9110 §15.4.5): to any other request it is no"
        " answer, and `evidence.redirect_not_followed.reason` says so.  The 3xx is the server's"
        " complete answer; whether"
        " the server acted on the request is not recorded (RFC 9110: a 3xx asks for further"
        " action to fulfil it; a 303 suggests the request was processed, a 301 or 307 that it"
        " was not): look before sending it again.",
    ),
    Code.REMOTE_COMMAND_FAILED: CodeInfo(
        _RE,
        _CM,
        Retry.NEVER,
        "The command ran and exited non-zero or by a signal (it did not fail to run).",
    ),
    Code.EXEC_REJECTED: CodeInfo(
        _RE, _RJ, Retry.AFTER_CORRECTION, "The SSH server refused the exec request."
    ),
    Code.RETRY_BUDGET_EXHAUSTED: CodeInfo(
        _RE,
        _UN,
        Retry.RECONCILE,
        "The invocation's retry budget is spent; the latest evidence stands, reconcile.",
    ),
    Code.IN_PROGRESS: CodeInfo(
        _RE,
        _UN,
        Retry.FETCH_RESULT,
        "The invocation has not finished (or its broker stopped and its lease has not expired):"
        " no result is recorded yet; fetch it later, never send it again.",
        pending=True,
    ),
    Code.RESULT_STORE_FAILED: CodeInfo(
        _RD,
        _UN,
        Retry.NEVER,
        "The remote result could not be stored durably; operator intervention is required.",
    ),
    Code.RESULT_DELIVERY_FAILED: CodeInfo(
        _RD,
        _CM,
        Retry.FETCH_RESULT,
        "The result is stored but could not be delivered; fetch it, do not re-run the action.",
    ),
}

assert set(CODES) == set(Code), "every code must be documented"
assert all(i.retry is Retry.FETCH_RESULT for i in CODES.values() if i.pending)
assert all(i.outcome is Outcome.UNKNOWN for i in CODES.values() if i.when_idempotent)
