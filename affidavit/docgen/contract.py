"""``docs/contract.md`` and ``docs/envelope.schema.json``, rendered from the code: the contract
enums and their member docstrings, ``CODES``, the lifecycle table, ``compute_retry()`` (whose
tables are computed by calling it) and ``decide()`` (quoted from its source), the registered
protocol tables and an example envelope rendered by ``render_envelope()``."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from affidavit.statemachine import (
    CODES,
    STATES,
    Code,
    Event,
    EventKind,
    EvidenceSource,
    Outcome,
    Phase,
    ProtocolTable,
    Retry,
    envelope_schema,
    project,
    registered,
    render_envelope,
)
from affidavit.statemachine import lifecycle as _lifecycle
from affidavit.statemachine import operation as _operation
from affidavit.statemachine.retry import RETENTION_MARGIN_S, HintInputs, compute_retry, decide

from .common import BANNER
from .graphs import protocol_slug, split_trigger

__all__ = ["contract_markdown", "member_docs", "schema_json", "table_cell"]


def member_docs(cls: type[Enum]) -> dict[str, str]:
    """Attribute docstrings of an enum's members (the string literal under each member), read
    from the source so the docs quote the code instead of a second copy of it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    classdef = tree.body[0]
    assert isinstance(classdef, ast.ClassDef)
    out: dict[str, str] = {}
    body = classdef.body
    for node, nxt in zip(body, [*body[1:], None], strict=True):
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        ):
            continue
        name = node.targets[0].id
        if name not in cls.__members__:
            continue
        if (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[cls[name].value] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return out


def table_cell(text: object) -> str:
    """A Markdown table cell: ``|`` escaped, newlines folded."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: Iterable[Iterable[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(table_cell(c) for c in row) + " |" for row in rows]
    return lines


def _enum_section(title: str, cls: type[Enum], intro: str) -> list[str]:
    docs = member_docs(cls)
    rows = [(f"`{m.value}`", docs.get(m.value, "")) for m in cls]
    return [f"## {title}", "", intro, "", *_table(("value", "meaning"), rows), ""]


def _hint(
    state: str,
    code: Code | None,
    *,
    idempotent: bool = False,
    key: str = "none",
    retry_after: float | None = None,
    budget_left: int = 2,
    deliverable: bool = True,
) -> Retry:
    now = 1_000.0
    expires = {
        "none": None,
        "no expiry": None,
        "within retention": now + 3_600.0,
        "past retention": now + RETENTION_MARGIN_S / 2,
    }[key]
    return compute_retry(
        HintInputs(
            state=state,
            outcome=STATES[state].outcome,
            code=code,
            idempotent=idempotent,
            key_expires_at=expires,
            has_key=key != "none",
            retry_after=retry_after,
            max_retry_after=300.0,
            budget_left=budget_left,
            now=now,
            deliverable=deliverable,
        )
    )


# Every input the tables above vary, for the Special states' "naming no requester" column.
_VARIANTS = [
    (idem, key, ra, left)
    for idem in (True, False)
    for key in ("none", "no expiry", "within retention", "past retention")
    for ra in (None, 30.0, 3_600.0)
    for left in (2, 0)
]


def _every_hint(state: str, *, deliverable: bool) -> list[Retry]:
    return [
        _hint(
            state,
            code,
            idempotent=idem,
            key=key,
            retry_after=ra,
            budget_left=left,
            deliverable=deliverable,
        )
        for code in (None, *Code)
        for idem, key, ra, left in _VARIANTS
    ]


def _naming_no_requester(state: str, hint: Retry) -> str:
    """The hint of a record naming no requester in ``state``, checked for every code and every
    input the tables vary: ``hint`` when the requester decides nothing there, "the stored
    result's" when every one is ``stored_*``'s; anything else is not what the column can say
    and fails generation."""
    nobody = _every_hint(state, deliverable=False)
    if nobody == _every_hint(state, deliverable=True):
        return f"`{hint}`"
    stored = state.replace("delivery_failed_", "stored_", 1)
    if stored != state and nobody == _every_hint(stored, deliverable=True):
        return "the stored result's (rules 6-8)"
    raise ValueError(
        f"{state}: the hint of a record naming no requester is neither the state's own nor "
        f"{stored}'s for every code; the Special states table cannot say it"
    )


def _retry_sections() -> list[str]:
    out = [
        "## How the retry hint is computed",
        "",
        "`compute_retry()` (statemachine/retry.py) derives the hint from the recorded evidence, "
        "the operation's configured semantics, the configured idempotency contract and its "
        "retention, Retry-After and the retry budget kept in the record — never from an "
        "exception's text. Its rules, in order:",
        "",
        "1. `delivery_failed_*` states: `fetch_result` (the result is stored; do not re-run) "
        "-- when the record names its requester (the latest asker's `requester`: "
        "ACTION_ACCEPTED's, a same-key retry's RETRY_LEASE_ACQUIRED's or a joined waiter's "
        "DISPATCH_LEASE_ACQUIRED's). One naming "
        'none (an older record\'s) is delivered by no read, so "fetch it" would be asked '
        "again after every fetch: its hint is its stored result's, by the rules below as for "
        '`stored_*` (the "naming no requester" column of Special states).',
        "2. `store_failed_*` states: `never` (storage needs an operator, not a remote retry).",
        "3. `reconciled_committed`: `never`; `reconciled_rejected`: `after_correction`.",
        "4. `not_attempted`: the code's default hint; a `backoff` code with the budget spent "
        "becomes `after_correction`; no code yet (in progress): `never`.",
        "5. `unknown`: a code whose evidence proves that the identical request meets the same "
        "end again (`"
        + "`, `".join(c.value for c in Code if CODES[c].when_idempotent)
        + "`: the remote was sending more than `max_result`), operation configured idempotent "
        "→ `after_correction` (raise the limit or ask for less; a resend after a delay only "
        "repeats it), any other operation → `reconcile` (a same-key resend gets back the "
        "result the remote stored for the key, the same one past the limit); otherwise budget "
        "spent → `reconcile`; operation configured idempotent → "
        "`backoff`; "
        "an idempotency key usable (no expiry, or more than "
        f"{RETENTION_MARGIN_S:g} s before the remote forgets it at the end of the send window "
        "recorded at acceptance -- the lease a retry taken now holds with the target's "
        "default timeout, `timeout.total` + `lease_margin`, during which it may still send; "
        "or, read by a broker or a CLI that knows the config, that lease under the current "
        "`[service] lease_margin` when it is longer -- the one a retry would take, and the "
        "lease check refuses it if the key cannot outlast it; "
        "a record without one is judged at the moment itself, or by that lease when read "
        "with the config) → `same_idempotency_key`; "
        "otherwise `reconcile`.",
        "6. `rejected`/`committed` without a code (success): `never` -- also while a stored "
        "result answered by reference awaits its fetch (`stored_*`, no delivery recorded): "
        "`never` is about sending the action again, not about fetching; what tells the caller "
        "to fetch is the answer's `result.by_reference` and its `fetch` pointer "
        "([journal](journal.md)).",
        "7. `REMOTE_THROTTLED`: `backoff` only when the retry is safe (idempotent, or a usable "
        'key), Retry-After was sent and is within the configured maximum (seed: backoff "if '
        'the method is safe to retry and the response specifies a suitable time"; without '
        "one the caller must look before sending again), and budget is left; otherwise "
        "`reconcile`. A batch item answered 429/503 follows the same rule (Batch items).",
        "8. Any other code: its default hint (table above).",
        "",
        "### When the hint is computed",
        "",
        "Rules 5 and 7 judge the idempotency key against the clock, so a hint holds for the "
        "moment it is computed. Every answer that shows one computes it when it answers, on "
        "the broker's clock (the wall clock of the process that reads the journal, for the "
        "CLI, the console and the daemon's views; on a shared PostgreSQL journal the "
        "database's clock, in whose time the key's retention is recorded: "
        "[journal](journal.md#clocks)): the envelope of a call, `fetch_result` "
        "(in process, from the daemon, the MCP tool), `record` (the API, the daemon, the MCP "
        "tool, `affidavit record`), the actions view (`list_actions`, `affidavit actions`) and "
        "the console -- never at the time of the record's last event. Read later with no new "
        "event, a record's "
        "hint becomes more conservative as time passes (a usable key runs out), with one "
        "exception: while the clock reads before the key's binding -- stepped back by an NTP "
        "step or a VM restored, or a shared PostgreSQL journal failed over to a server whose "
        "clock is behind -- no retention is known and the hint is `reconcile`; once the clock "
        "reads past the binding again, the key is judged again, and a key still usable is "
        "`same_idempotency_key` again. Either way no read says a same-key resend is safe after "
        "the remote may have forgotten the key: a key is judged at the later of the clock's "
        "reading and its binding plus the boot-clock time elapsed since (on the boot that "
        "bound it), and a reading from before its binding leaves no retention known "
        "([journal](journal.md#clocks), `statemachine.key_moment`). A listing computes all of "
        "its hints at one moment.",
        "",
        "A record that rests in no final state (an attempt runs, waits for an operator, or its "
        "broker stopped and no read has closed it yet) is shown with `fetch_result` by every "
        "view (`record`, the actions view, the console: `views.shown_retry`), as its envelope "
        "says (IN_PROGRESS): a same-key call then answers IN_PROGRESS, and a new call would be "
        "a second active attempt -- the hint of the attempt before it, a `backoff` or "
        "`same_idempotency_key`, is no longer what automation may do. Nor is the code that "
        "ended that attempt the record's: a retry holding its lease before it dispatches "
        "(`retry_pending`; `validated` after a refusal that asked to back off) is shown with "
        "`code` and `field` null and `message` empty (`views.shown_error`), the earlier "
        "attempt's code staying in its `attempts` entry, and is counted (the metrics by code) "
        "and filtered (the console's code filter) under the code shown, `OK` when none "
        "(`views.shown_code`); a waiting record's APPROVAL_PENDING "
        "and the running attempt's own complete result (`completed_*`) are shown. Its `state` "
        "says what "
        "runs and `evidence.lease` whose attempt it is and until when its lease holds the "
        "invocation (`expires_at`, seconds since the epoch by the clock leases are judged by: "
        "the broker host's on SQLite, the database's on a shared PostgreSQL journal "
        "([journal](journal.md#clocks)), not the caller's; a same-key call answers IN_PROGRESS "
        "until then, and after it a same-key call or `fetch_result` closes the attempt with "
        "what the journal proves, a view does not); once it rests again, its own hint is shown, "
        "and its `evidence.lease` without `expires_at` (`statemachine.shown_evidence`, in "
        "every view and envelope): a record at rest holds no lease -- its attempt is over, a "
        "same-key call is answered from the record -- and a deadline would say it is held.",
        "",
        "The stored result (the remote's summary and streams, the hash RESULT_COMMITTED "
        "records) is a historical document: it is served as committed and holds no hint. The "
        "envelope around it -- `phase`, `outcome`, `code`, `retry` -- is the record's, "
        "projected when the read answers, so a stored result fetched again carries today's "
        "hint. An envelope kept from earlier (a call's own answer, a downloaded "
        "`result.json`) shows the hint of its moment: read the record again before acting on "
        "an old one.",
        "",
        "The tables below are computed by calling `compute_retry()` while generating this file.",
        "",
        "### Before dispatch (`not_attempted`)",
        "",
    ]
    # Stop causes (CodeInfo.before_dispatch) too: before the gate they end in setup_failed.
    pre = [
        c
        for c in Code
        if CODES[c].outcome is Outcome.NOT_ATTEMPTED or CODES[c].before_dispatch is not None
    ]
    state_of = {
        Phase.VALIDATION: "validation_failed",
        Phase.CREDENTIAL_INJECTION: "credential_failed",
        Phase.CONNECTION_SETUP: "setup_failed",
    }
    rows: list[tuple[str, ...]] = []
    for c in pre:
        if CODES[c].pending:
            st = "awaiting_approval"  # a code a waiting record shows, not an ending
        elif CODES[c].outcome is Outcome.NOT_ATTEMPTED:
            st = state_of[CODES[c].phase]
        else:
            st = "setup_failed"
        rows.append((f"`{c.value}`", f"`{_hint(st, c)}`", f"`{_hint(st, c, budget_left=0)}`"))
    out += _table(("code", "budget left", "budget spent"), rows)
    out += ["", "### After dispatch without a complete result (`unknown`)", ""]
    rows = []
    for idem in (True, False):
        for key in ("none", "no expiry", "within retention", "past retention"):
            code = Code.REMOTE_OUTCOME_UNKNOWN
            with_budget = _hint("interrupted", code, idempotent=idem, key=key)
            spent = _hint("interrupted", code, idempotent=idem, key=key, budget_left=0)
            rows.append(("yes" if idem else "no", key, f"`{with_budget}`", f"`{spent}`"))
    for c in Code:
        if CODES[c].when_idempotent is None:
            continue
        for idem, key in ((True, "none"), (False, "none"), (False, "within retention")):
            with_budget = _hint("interrupted", c, idempotent=idem, key=key)
            spent = _hint("interrupted", c, idempotent=idem, key=key, budget_left=0)
            label = f"{'yes' if idem else 'no'} (`{c.value}`)"
            rows.append((label, key, f"`{with_budget}`", f"`{spent}`"))
    out += _table(("idempotent", "idempotency key", "budget left", "budget spent"), rows)
    out += ["", "### Complete result (`rejected` / `committed`)", ""]
    rows = [("success (no code)", "—", "—", f"`{_hint('stored_committed', None)}`")]
    for c in Code:
        info = CODES[c]
        if info.phase is Phase.REMOTE_EXECUTION and info.outcome in (
            Outcome.REJECTED,
            Outcome.COMMITTED,
        ):
            if c is Code.REMOTE_THROTTLED:
                continue
            st = f"stored_{info.outcome.value}"
            rows.append((f"`{c.value}`", "any", "any", f"`{_hint(st, c)}`"))
    throttled = [
        ("idempotent", True, "none", None, 2),
        ("idempotent", True, "none", 30.0, 2),
        ("idempotent", True, "none", 3_600.0, 2),
        ("idempotent, budget spent", True, "none", 30.0, 0),
        ("key within retention", False, "within retention", 30.0, 2),
        ("key past retention", False, "past retention", 30.0, 2),
        ("neither", False, "none", 30.0, 2),
    ]
    for label, idem, key, ra, left in throttled:
        hint = _hint(
            "stored_rejected",
            Code.REMOTE_THROTTLED,
            idempotent=idem,
            key=key,
            retry_after=ra,
            budget_left=left,
        )
        ra_text = "absent" if ra is None else f"{ra:g} s (max 300 s)"
        rows.append(("`REMOTE_THROTTLED`", label, ra_text, f"`{hint}`"))
    out += _table(("code", "safe to retry", "Retry-After", "hint"), rows)
    out += ["", "### Special states", ""]
    rows = []
    for st in sorted(STATES):
        if st.startswith(("delivery_failed_", "store_failed_", "reconciled_")):
            hint = _hint(st, None)
            rows.append((f"`{st}`", f"`{hint}`", _naming_no_requester(st, hint)))
    out += _table(("state", "hint", "naming no requester"), rows)
    out += [
        "",
        "## decide(record, operation)",
        "",
        "Automation acts on the hint with the seed's `decide()`, transcribed line for line "
        "(statemachine/retry.py). It may add rate and attempt limits, never upgrade a hint. "
        "The engine's own same-key call adds one: a record hinted `after_correction` is "
        "answered from the record, never sent again (`decide()` alone re-sends any unknown "
        "idempotent operation; one cut at `max_result` would meet the same limit).",
        "",
        "```python",
        inspect.getsource(decide).rstrip(),
        "```",
        "",
    ]
    return out


def _operation_section() -> list[str]:
    out = [
        "## Operations",
        "",
        "A complete 202 on a target that declares `operations` is a committed result — the job "
        'was accepted — and the job is tracked as an operation of its own (seed: "track the '
        "job as a separate operation\"). Its events live in the submitting invocation's "
        "stream (the lifecycle table above allows them after the complete 202, never moving the "
        "invocation's state); its id is the submission's with `op_` for `act_`; the envelope "
        "carries it as `operation`. A poll is a linked invocation; what it read moves the "
        "operation, a poll without a readable answer (no complete 2xx; a body withheld or "
        "truncated; an answer a redirect fetched from another origin) leaves it as it was, and "
        "a terminal state is never left. A 202's job id is read from its body only when the body "
        "is whole. Two polls of an operation that reach the status resource are at least its "
        "target's `operations.min_poll_interval` apart (1 s unless it says: each poll adds to "
        "the submission's stream, so it grows by at most a poll per interval of the job's "
        "life); a poll sooner, whoever asks, is refused `POLL_TOO_SOON` with when to poll "
        "again, nothing asked or recorded (but the row closing an open poll never sent, "
        "denied or expired, before a new one would be asked) -- the job still pending as its "
        "last poll left it, read again when refused (an end recorded meanwhile is answered); "
        "an ended job is still answered, a poll still open still taken up, and the stream "
        "stays readable, through the daemon a page of events at a time. "
        "Diagram: [../diagrams/operation.mmd](../diagrams/operation.mmd).",
        "",
    ]
    out += _table(
        ("state", "terminal", "meaning"),
        (
            (f"`{name}`", "yes" if spec.terminal else "no", spec.doc)
            for name, spec in sorted(_operation.STATES.items())
        ),
    )
    out += ["", "Transitions (`EVENT:state`: the event's `attrs.state` selects the state):", ""]
    rows = [
        (f"`{src}`", f"`{_operation.trigger(src, ev, dst)}`", f"`{dst}`")
        for src, ev, dst in _operation.edges()
    ]
    out += _table(("state", "event", "next state"), rows)
    out += [
        "",
        "## Batch items",
        "",
        "A batch's items are bound when the invocation is accepted (`operation.batch` of "
        "ACTION_ACCEPTED); the envelope's `items` gives each one an outcome, code and retry hint "
        "beside the parent's. Only a complete response (BATCH_ITEMS_RECORDED) whose body is "
        "whole -- not withheld (`body_withheld`: a corrupt or unsupported coding, a "
        "decompression bomb), not `body_truncated` -- gives an item its own (from a cut body "
        "no item outcome is read: every item is `unknown` / `REMOTE_RESULT_INCOMPLETE` / "
        "`reconcile`, or shares a whole request's rejection); until then every item shares the "
        "parent's outcome, code and hint "
        "(`not_attempted` before dispatch, `unknown` after it), and a parent resolved without "
        "item outcomes leaves every item `unknown` / `REMOTE_RESULT_INCOMPLETE` / `reconcile` "
        "(unless a reconciliation settled an atomic batch: below). "
        "An item is never `not_attempted` once its batch was dispatched.",
        "",
        "An item's own outcome stands only on what a complete success (a 2xx, no code) says of "
        "that item. Results are matched by the target's `item_id`: a batch sent with an item "
        'lacking an id, or two items sharing one (`7` and `"7"` are one id), is refused '
        "`INVALID_FIELD` at the item's id (`body.items[1].id`, `body_base64.items[1].id`) "
        "before anything is sent -- "
        "matched by position while the response lists them by id, an applied item would be "
        "recorded `rejected` / `after_correction` and applied again by a corrected resend. "
        "Without `item_id`, results match by position only when the list answers every item "
        "sent. An item the response names twice with different statuses is `unknown` / "
        "`REMOTE_RESULT_INCOMPLETE` / `reconcile`. A parent that is no success gives no item a "
        "status of its own nor a hint stronger than its own. A rejection (a 4xx, 401 and 503 "
        "included) speaks for an item only when the body, read whole, holds no item list at all "
        "(no body, no JSON, another shape), or lists that item as refused (a status in "
        "`rejected`, 400-499 or 503): the item keeps the parent's code. With a list present, an "
        "item it lists with anything else (a 400 listing one item 201, another 422: the first "
        "may be applied, and `rejected` would invite a resend applying it twice), with no "
        "readable status, or leaves out (a positional list of another length leaves out every "
        "item) is `unknown` / `REMOTE_RESULT_INCOMPLETE` / `reconcile`, and so is every item "
        "when the body was not read whole or is unreadable. "
        "Anything else (a 5xx that may have applied any item, a "
        "redirect not followed) leaves each `unknown`. Beside an item such a parent does not "
        "refuse, the record's hint is `reconcile`, whatever the parent's code would give: "
        "its `after_correction` would resend that item too (seed: a single retry hint cannot "
        "safely be assigned to the whole batch). The journal's writer refuses "
        "BATCH_ITEMS_RECORDED that breaks this "
        "(statemachine/batch.py); such a row written before the rule reads as every item "
        "`unknown` -- unless every item in it is one the writer accepts, or refused with the "
        "parent's code beside the status it was listed with (a refusal, as the code says): "
        "then it reads as written -- but a row matched by position (ids 0, 1, ...) only when "
        "every item holds a status (a shorter list was matched to the first items).",
        "",
        "An item answered 429 or 503 (`REMOTE_THROTTLED`) gets the hint a whole request "
        "answered 429/503 would get on the same record -- rule 7 of How the retry hint is "
        "computed, by the same code (`retry_hint`): `backoff` only when the method is "
        "configured idempotent or a usable idempotency key covers the batch, the response "
        "specified a Retry-After within the configured maximum, and budget is left; otherwise "
        "`reconcile`. Resending one item of a non-idempotent `POST` is no safer than resending "
        "the `POST`. BATCH_ITEMS_RECORDED keeps such an item's hint as `reconcile` (the "
        "response alone never makes a resend safe); the record computes the item's hint as it "
        "computes the parent's. An atomic batch's mixed answer leaves every item `reconcile`. "
        'A batch is reconciled as a whole only when it was sent `atomic` (seed: "reconcile '
        'the batch as a whole if the remote API applies changes atomically"): then every item '
        "takes the reconciled outcome, code and hint, with the reconciliation's `source` "
        "(`remote_query`, `operator_attested`). A batch the remote applies item by item is "
        "never settled by one observation of the effect: its query and attestation are "
        "refused `BATCH_NOT_ATOMIC` (409), nothing sent, the record left `unknown`. "
        "While the record rests in no final state (an attempt runs, a retry holds its lease, "
        "an operator is asked) every item says `fetch_result`, as the record does "
        "(`shown_items`): an item's own hint would invite a resend while an attempt is active. "
        "Nor does an item of a running retry keep the code of the attempt before it (`code` "
        "null, as the record's: `views.shown_error`).",
        "",
    ]
    return out


def _holder_section() -> list[str]:
    return [
        "## The lease holder",
        "",
        "The journal records a lease's holder as `hostname:pid:hex` (the broker process and a "
        "random part; the `holder` attr of ACTION_ACCEPTED, DISPATCH_LEASE_ACQUIRED, "
        "RETRY_LEASE_ACQUIRED and LEASE_LOST). A caller is never shown it: on a shared journal "
        "it names other brokers' hosts and pids. Every caller-facing answer -- the envelope's "
        "`evidence.lease.holder`, the record, events and actions views of the daemon and MCP "
        "(`statemachine.caller_record`, `caller_event`) -- shows instead "
        "`hmac-sha256:<hex>`, the HMAC-SHA256 under the journal's broker key (`[journal] "
        "key_file`; purpose label `lease holder`) of the invocation id, a NUL byte and the "
        "recorded holder (`JournalReader.holder_tag`). It is derived from the record alone: "
        "the same in every broker of the journal and across restarts, equal for two answers "
        "under the same holder of an invocation (with `generation` and `seq`, the same lease), "
        "different for another holder; without the key it cannot be reversed, nor checked "
        "against a guessed host name and pid, and it links no two invocations. A rendering "
        "given no key shows `withheld`, never the recorded value. Operators see the recorded "
        "holder (`affidavit record`, `affidavit actions` run embedded, the console); "
        "`affidavit journal holder ID [SHOWN]` lists an invocation's recorded holders beside "
        "the value a caller is shown for each, or maps a shown value back to its holder "
        "(NO_SUCH_HOLDER, exit 2, when none of the invocation's holders is shown so).",
    ]


def _example_envelope() -> str:
    iid = "act_01JEXAMPLE"
    events = [
        Event(
            EventKind.ACTION_ACCEPTED,
            iid,
            {
                "operation": {
                    "target": "payments",
                    "protocol": "http",
                    "idempotent": False,
                    "fingerprint": "sha256:8b1e",
                    "idempotency": {"key": "req_01JEXAMPLE", "scope": "payments.create"},
                }
            },
            seq=1,
        ),
        Event(EventKind.PREFLIGHT_VALIDATED, iid, {"config_hash": "hmac-sha256:c0f1"}, seq=2),
        Event(
            EventKind.CREDENTIAL_AUTHORIZED,
            iid,
            {
                "version": "3",
                "inject": "bearer",
                "idempotency_header": "Idempotency-Key",
                "generation": 0,
            },
            seq=3,
        ),
        Event(EventKind.DISPATCH_STARTED, iid, {"generation": 0}, seq=4),
        Event(EventKind.REQUEST_SENT, iid, seq=5),
        Event(
            EventKind.ATTEMPT_INTERRUPTED,
            iid,
            {
                "code": Code.REMOTE_OUTCOME_UNKNOWN.value,
                "message": "Connection closed before a complete response was recorded.",
            },
            seq=6,
        ),
    ]
    # As of its last event (now=None): an example must render the same on every run.
    return json.dumps(render_envelope(project(events, None)), indent=2)


def contract_markdown(protocols: Mapping[str, ProtocolTable] | None = None) -> str:
    """docs/contract.md, rendered from the code; ``protocols`` defaults to the registered
    tables."""
    out = [
        f"<!-- {BANNER} -->",
        "",
        "# The Affidavit contract",
        "",
        "Every error envelope carries a `phase` (where the broker stopped — for the operator), "
        "an `outcome` (what may already have happened remotely — for the caller) and a `retry` "
        "hint (what automation may do now), plus a stable `code`. All four are closed "
        "enumerations: branch on them; show `message` to humans and never parse it. The JSON "
        "Schema of the envelope is [envelope.schema.json](envelope.schema.json).",
        "",
        "This file is generated from statemachine/contract.py, statemachine/lifecycle.py and "
        "statemachine/retry.py; a test fails when it is stale.",
        "",
    ]
    out += _enum_section("Phases", Phase, "Where the broker stopped. For diagnosis only.")
    out += _enum_section(
        "Outcomes",
        Outcome,
        "What the durable records prove about the remote operation. `rejected` and `committed` "
        "are never merged: after a rejection a corrected request may be sent; a committed "
        "result must be used or reconciled. `committed` does not mean success.",
    )
    out += _enum_section("Retry hint values", Retry, "What automation may do now.")
    out += _enum_section(
        "Evidence sources",
        EvidenceSource,
        "How the broker knows what an event claims; `evidence.source` names it.",
    )
    out += [
        "## Codes",
        "",
        "Phase, typical outcome and default retry of every code. The projection may refine "
        "the retry hint from evidence (see How the retry hint is computed). The stop causes "
        + ", ".join(f"`{c.value}`" for c in Code if CODES[c].before_dispatch is not None)
        + " name why a running call ended; where it stood decides the rest: after dispatch "
        "they are the row shown, before it they end connection setup with outcome "
        "`not_attempted` (table Before dispatch).",
        "",
    ]
    out += _table(
        ("code", "phase", "typical outcome", "default retry", "meaning"),
        (
            (
                f"`{c.value}`",
                CODES[c].phase.value,
                CODES[c].outcome.value,
                CODES[c].retry.value,
                CODES[c].meaning,
            )
            for c in Code
        ),
    )
    out += [
        "",
        "A `rejected` or `committed` code needs a complete answer that is the remote's own. "
        "Through a plain-HTTP forward proxy a 4xx or 5xx may be the proxy's (its `403` for a "
        "denied request, `404` for a domain it cannot resolve, `429`, `502`), written before "
        "or after the origin saw the request: without RFC 9209 `received-status` naming that "
        "status it is never `REMOTE_REJECTED`, `REMOTE_THROTTLED` or `REMOTE_ERROR` but "
        '`REMOTE_OUTCOME_UNKNOWN`, `evidence.evidence_from.hop` `"proxy"`, and it settles no '
        "reconciliation (docs/proxies.md). Through a CONNECT tunnel the answer is the "
        "origin's.",
        "",
        "Nor is it decided by an answer to another request. A redirect that would change the "
        "request -- a 303 after anything but GET or HEAD, a POST's 301 or 302: RFC 9110 has "
        "the next hop GET without the content -- is not followed, nor a 301 or 302 of any "
        "method but GET, HEAD and those the target declares `idempotent` (following it sends "
        "the request again). A 3xx that is the result -- not followed for those reasons, by "
        "the redirect policy, at `max_redirects`, or with `follow_redirects` off -- is "
        "`committed` / `REMOTE_REDIRECTED` / `reconcile`: the 3xx is the server's complete "
        "answer; whether the server acted on the request is not recorded. "
        "`evidence.redirect_not_followed` says why it was not followed (the Location itself "
        "is among the result's headers unless it echoes the credential). "
        "A 304 answers only a conditional GET or HEAD (`If-None-Match`, `If-Modified-Since`: "
        "RFC 9110 §15.4.5), and only then is it a clean result; to any other request -- a GET "
        "without either field, a POST -- it is no answer: `committed` / `REMOTE_REDIRECTED` / "
        "`reconcile` too, `redirect_not_followed.reason` saying so. "
        "A followed hop sent without the credential (another origin in `redirect_origins`, or "
        "a path outside the base path) that answers with what would be a rejection (4xx, 429, "
        "503) is no `REMOTE_REJECTED` or `REMOTE_THROTTLED` -- its 401 is no proof that the "
        "credential was rejected: the last 3xx to a request that carried the credential "
        "stays the result, "
        "`redirect_not_followed` naming that hop, its origin and status "
        '(docs/design-notes.md, "Redirect hops").',
        "",
        "Nothing is decided from a body that was not received whole: a reconciliation verdict, "
        "a job's state read by a poll, the job id of a 202 and a batch's item outcomes are read "
        "only from a body neither withheld (`body_withheld`: `corrupt_encoding` -- a gzip "
        "without its trailer --, `unsupported_content_encoding`, `decoded_size_limit`) nor "
        "`body_truncated`, even when the prefix parses. A reconciliation query or a poll "
        "settles nothing on an answer a followed redirect fetched from another origin than the "
        "target's (`redirect_origins`), or from its origin outside its base path -- a hop sent "
        "without the credential (`summary.hops[].credential_sent`): RECONCILE_INCONCLUSIVE / "
        "OPERATION_POLL_FAILED with "
        "the reason; nor does a reconciliation query settle anything on an answer reached "
        "through any followed redirect, even on the target's origin with the credential "
        "(`301 -> /v1/maintenance` then 404: another resource's answer, not the query's): "
        "RECONCILE_INCONCLUSIVE, reason `answered by a redirect to PATH: not the queried "
        "resource's answer` (PATH: `summary.hops[-1].path`, the final hop's path without its "
        "query or `;` parameters such as `;jsessionid=`, cut at 200 characters ending "
        "`...[cut]`); from an answer a redirect fetched elsewhere nothing is read for batch items "
        "or a 202's job -- "
        "neither its body nor its headers (a relative Location there would have named a "
        "status resource on the target): no BATCH_ITEMS_RECORDED, no OPERATION_ACCEPTED. "
        "Nor is anything decided from JSON that readers disagree on: a body naming a field "
        'twice in one object (`{"status": 200, "status": 400}`: Python keeps the last, '
        "other readers the first), holding `NaN`/`Infinity`, a number beyond a double's range "
        "(`1e400`), an integer of more than 4300 digits, invalid UTF-8 inside a string (an "
        "encoded surrogate too), or nested deeper than 500 levels is unreadable "
        "(`selectors.UNREADABLE`) -- it names no batch item list, no job id, no job state, and "
        "a reconciliation query settles nothing (RECONCILE_INCONCLUSIVE) on a non-empty body "
        "that is unreadable or no JSON text when a side whose other conditions hold has a "
        "`json:` condition, whatever a `status:` condition says. A body sent to a target "
        "declaring `batch` is read the same way, item list or not: a field named twice is "
        "refused `INVALID_FIELD` at its path (`body.items[0].id`, `body_base64.items[0].id`), "
        "anything else unreadable at the body's field (`body`, `body_base64`), before anything "
        "is sent.",
    ]
    out += [
        "",
        "## Lifecycle states",
        "",
        "Every state carries its phase and outcome; `final` states are where an invocation may "
        "rest. Diagram: [../diagrams/lifecycle.mmd](../diagrams/lifecycle.mmd).",
        "",
    ]
    out += _table(
        ("state", "phase", "outcome", "final", "meaning"),
        (
            (f"`{name}`", s.phase.value, s.outcome.value, "yes" if s.final else "no", s.doc)
            for name, s in sorted(STATES.items())
        ),
    )
    out += [
        "",
        "## Events",
        "",
        "The journal stores these append-only; the projection folds them through the "
        "transition table below.",
        "",
    ]
    ev_docs = member_docs(EventKind)
    out += _table(
        ("event", "meaning"), ((f"`{k.value}`", ev_docs.get(k.value, "")) for k in EventKind)
    )
    out += [
        "",
        "## Transition table",
        "",
        "A (state, event) pair not listed is impossible: the projection refuses it and the "
        "record stays as it was. `EVENT:outcome` means the event's `attrs.outcome` selects the "
        "destination.",
        "",
    ]
    rows = []
    for src, ev, dst in _lifecycle.edges():
        rows.append((f"`{src}`", f"`{split_trigger(src, ev, dst)}`", f"`{dst}`"))
    out += _table(("state", "event", "next state"), rows)
    out += [""]
    out += _operation_section()
    out += _retry_sections()
    protos = registered() if protocols is None else dict(sorted(protocols.items()))
    out += ["## Protocol tables", ""]
    if protos:
        out += [
            "Registered by the adapters; each marks its dispatch boundary and the transitions "
            "that prove a complete result.",
            "",
        ]
        for name, table in protos.items():
            slug = protocol_slug(name)
            dispatch = ", ".join(f"`{s} --{e}-->`" for s, e in sorted(table.dispatch))
            completes = ", ".join(f"`{s} --{e}-->`" for s, e in sorted(table.completes))
            out.append(
                f"- `{name}` ([diagram](../diagrams/protocol-{slug}.mmd)): dispatch at "
                f"{dispatch}; completes at {completes}."
            )
    else:
        out.append("No protocol table is registered.")
    out += ["", *_holder_section()]
    out += [
        "",
        "## Example envelope",
        "",
        "A non-idempotent POST with a configured idempotency key whose connection closed after "
        "the request was written (rendered by `render_envelope()` from projected events):",
        "",
        "```json",
        _example_envelope(),
        "```",
        "",
    ]
    return "\n".join(out)


def schema_json() -> str:
    schema: dict[str, Any] = {"$comment": BANNER, **envelope_schema()}
    return json.dumps(schema, indent=2) + "\n"
