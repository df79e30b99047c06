"""``affidavit approvals`` and ``affidavit reconcile``: the operator's commands (docs/approvals.md).

    affidavit approvals [--json]                 requests waiting for a decision
    affidavit approvals show ID                  one invocation's approval (JSON)
    affidavit approvals show ID --content NAME   its content NAME (body, stdin) whole, the
                                                 exact bytes, on stdout (checked: its SHA-256
                                                 is the one the approval shows)
    affidavit approvals approve ID [--note T]    APPROVAL_GRANTED; the request is then sent once
                        [--blind]               ... even one whose request cannot be read here
    affidavit approvals deny ID [--note T]       APPROVAL_DENIED; it is never sent
    affidavit approvals revoke ID --note T       APPROVAL_REVOKED: a grant not yet sent taken
                                                 back; it is never sent
    affidavit reconcile ID --query               run the target's reconciliation query
    affidavit reconcile ID --attest committed|rejected --note TEXT

Embedded, the identity is this process's user and the journal is read and written here; with
``--socket`` (or ``$AFFIDAVIT_SOCKET``) the daemon checks the socket peer's uid against
``[service] operator_uids`` / ``operator_gids`` and records the decision itself.  Either way the
rules are ``affidavit.approvals`` / ``affidavit.reconcile``'s.

Exit status: 0 done (``reconcile``: the outcome is settled); 1 ``reconcile --query`` settled
nothing (the invocation stays unknown; the query's evidence is on its own record); 2 refused
(not an operator, the requester itself, no longer pending, not unknown), usage, config, an
unreachable daemon, or a journal that cannot be read or written now (a shared journal's
database away: what could not be read or recorded is named, as the daemon's 503
JOURNAL_UNAVAILABLE names it) -- one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from affidavit.cli import (
    JSON_HELP,
    SECRETS_EMBEDDED,
    DaemonSocket,
    UsageError,
    add_socket_arg,
    ask_daemon,
    daemon_refusal,
    daemon_socket,
    refusal,
    text_arg,
    timeout_arg,
)
from affidavit.cli.call import acting, load_or_usage, run_journal

__all__ = ["add_commands"]

T = TypeVar("T")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("approvals", help="requests waiting for an operator; approve or deny one")
    _options(p)
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(handler=_list, holds_secrets=SECRETS_EMBEDDED)
    asub = p.add_subparsers(dest="approvals_command", metavar="APPROVALS_COMMAND")
    show = asub.add_parser("show", help="one invocation's approval, whatever became of it")
    show.add_argument("invocation_id")
    show.add_argument(
        "--content",
        metavar="NAME",
        help="write the request's content NAME (body, stdin) whole to stdout, as raw bytes: "
        "what the approval view shows only when small (its SHA-256 is checked)",
    )
    _options(show, inherited=True)
    show.set_defaults(handler=_show, holds_secrets=SECRETS_EMBEDDED)
    for verb, what in (
        ("approve", "approve: it is then sent once"),
        ("deny", "deny: never sent"),
        ("revoke", "take back an approval not yet sent: never sent (needs --note)"),
    ):
        d = asub.add_parser(verb, help=f"{what} (operators only)")
        d.add_argument("invocation_id")
        d.add_argument("--note", help="why, kept in the journal with your identity")
        if verb == "approve":
            d.add_argument(
                "--blind",
                action="store_true",
                help="approve even though the sealed request cannot be read here (refused "
                "REQUEST_UNREADABLE otherwise); the grant records that it was blind",
            )
        _options(d, inherited=True)
        d.set_defaults(handler=_decide, holds_secrets=SECRETS_EMBEDDED, verb=verb, blind=False)

    r = sub.add_parser("reconcile", help="settle an unknown outcome: query the remote, or attest")
    r.add_argument("invocation_id")
    how = r.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--query",
        action="store_true",
        help="run the target's configured reconciliation query as a linked invocation",
    )
    how.add_argument(
        "--attest",
        choices=("committed", "rejected"),
        help="record what you found on the remote system (operators only; needs --note)",
    )
    r.add_argument("--note", help="what you checked (kept in the journal with your identity)")
    r.add_argument("--timeout", help="caller timeout in seconds for the query", metavar="SECONDS")
    _options(r)
    r.set_defaults(handler=_reconcile, holds_secrets=SECRETS_EMBEDDED)


def _options(p: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """``--config`` and the socket's options; ``inherited``: a sub-command's copies of
    ``approvals``' own, given before or after its name (``add_socket_arg``)."""
    keep = argparse.SUPPRESS if inherited else None
    what = "config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)"
    p.add_argument("--config", default=keep, help=what)
    add_socket_arg(p, inherited=inherited)


def _operator_errors(work: Callable[[], T]) -> T:
    """The service's refusals as one line, exit 2: ``affidavit: NOT_AN_OPERATOR: ...``."""
    from affidavit.approvals import OperatorError

    try:
        return work()
    except OperatorError as exc:
        raise _flagged(exc.message, exc.code, exc.field) from None


FLAGS = {
    "note": "--note",
    "blind": "--blind",
    "attest": "--attest",
    "query": "--query",
    "name": "--content",
}
"""The fields the operator services and the daemon's routes name (a body's key, the path's
content ``name``) as these commands spell them: a refusal names the option to correct, never
another interface's key (``note`` on the socket is ``--note`` here)."""


def _flagged(message: str, code: str | None, field: str | None) -> UsageError:
    """``refusal``, its ``field`` -- and the message's lead, when it names it -- as this command
    line spells it (``FLAGS``); embedded and through the daemon alike."""
    flag = FLAGS.get(field or "")
    if flag is not None:
        message, field = message.removeprefix(f"{field}: "), flag
    return refusal(message, code, field)


def _daemon_answer(socket: DaemonSocket, method: str, target: str, body: Any = None) -> Any:
    """``daemon_json``'s, a refusal's field as spelt here (``_refused``)."""
    from affidavit.api.wire import ClientError

    data = None if body is None else json.dumps(body).encode("utf-8")
    response = ask_daemon(socket, method, target, data)
    try:
        return response.json()
    except ClientError as exc:
        raise _refused(exc) from None


def _refused(exc: Exception) -> UsageError:
    """``daemon_refusal``, an API refusal's field as spelt here (``_flagged``)."""
    from affidavit.api.wire import ApiError

    if isinstance(exc, ApiError):
        return _flagged(exc.message, exc.code, exc.field)
    return daemon_refusal(exc)


def _embedded(
    args: argparse.Namespace,
    work: Callable[[Any], Awaitable[T]],
    failure: Callable[[Exception], tuple[int, str, str]],
) -> T:
    """``work(broker)`` in a broker of this process (the journal written here); ``failure``
    answers a journal that could not do it (``decision_failure``), one that could not be
    opened is answered as ``call`` answers it (``acting``)."""
    config = load_or_usage(args.config)
    return _operator_errors(lambda: run_journal(lambda: acting(config, work, failure)))


def _reading(args: argparse.Namespace, view: Callable[[Any], T], what: str) -> T:
    """``view(reader)`` on the journal, read-only, with the broker's key (the request an
    approval binds is sealed); a journal that cannot be read names ``what``, as the daemon
    does (``read_refusal``)."""
    from affidavit.cli.journal import read_refusal
    from affidavit.journal import JournalError, JournalReader

    config = load_or_usage(args.config)
    try:
        with JournalReader.open(config.journal.location, key_file=config.journal.key_file) as j:
            return _operator_errors(lambda: view(j))
    except JournalError as exc:
        raise read_refusal(exc, what) from None


# --- approvals ---------------------------------------------------------------------------------


def _list(args: argparse.Namespace) -> int:
    socket = daemon_socket(args, "config")
    if socket is not None:
        rows = _daemon_answer(socket, "GET", "/v1/approvals")
    else:
        from affidavit import approvals

        rows = _reading(args, approvals.pending, "the pending approvals")
    if args.json:
        _print(rows)
        return 0
    from affidavit.text import cell

    head = ("INVOCATION", "TARGET", "EXPIRES IN", "REQUESTER", "CREDENTIAL")
    print(f"{head[0]:30} {head[1]:12} {head[2]:>10}  {head[3]:9} {head[4]:24} WHAT")
    for row in rows:
        # By the clock the view judged ``expired`` in (the database's on a shared journal),
        # never this host's: ``expires_at`` is in that clock's time.
        left = float(row.get("expires_in") or 0)
        expires = "expired" if row["expired"] or left <= 0 else f"{int(left)}s"
        requester = (row.get("requester") or {}).get("uid", "-")
        # Each cell by ``cell``, the last, WHAT, too (quoted, never cut): a command or URL came
        # from the caller, and its literal ``\u00a0`` must not read as a real U+00A0.
        print(
            f"{cell(row['invocation_id'], 30)} {cell(row['target'] or '-', 12)} "
            f"{cell(expires, 10, right=True)}  {cell(requester, 9)} "
            f"{cell(row['credential'] or '-', 24)} {cell(_what(row.get('request')), 0)}"
        )
    return 0


def _what(request: Any) -> str:
    """One line of what will be sent where (``approvals show`` has all of it)."""
    if not isinstance(request, dict):
        return "(sealed: not readable here)"
    if "method" in request:
        line = f"{request['method']} {request.get('url', '')} ({request.get('body_bytes', 0)} B)"
    elif "command" in request:
        line = f"{request.get('destination', '')} $ {request['command']}"
        if "stdin_bytes" in request:
            # The script ``sh -s`` runs is its stdin: never a row that shows only "sh -s".
            line += f" + stdin ({request['stdin_bytes']} B)"
    else:
        return json.dumps(request, sort_keys=True)
    if "idempotency_key" in request:
        # The agent's key, under the header it is sent in (HTTP); SSH sends none.
        line += f" {request.get('idempotency_header') or 'idempotency_key'}: "
        line += str(request["idempotency_key"])
    return line


def _show(args: argparse.Namespace) -> int:
    iid = text_arg(args.invocation_id, "the invocation id")
    assert iid is not None
    if args.content is not None:
        return _content(args, iid, text_arg(args.content, "--content") or "")
    socket = daemon_socket(args, "config")
    if socket is not None:
        from affidavit.api.wire import approval_path

        _print(_daemon_answer(socket, "GET", approval_path(iid)))
        return 0
    from affidavit import approvals

    _print(_reading(args, lambda j: approvals.show(j, iid), f"the approval of {iid}"))
    return 0


def _content(args: argparse.Namespace, iid: str, name: str) -> int:
    """``show --content NAME``: the bytes ``approvals.content`` vouches for, raw on stdout --
    never to a terminal, which the agent's bytes could drive."""
    if sys.stdout.isatty():
        raise UsageError(
            "--content writes raw bytes: redirect it to a file (> FILE)",
            "RAW_TO_TERMINAL",
            "--content",
        )
    socket = daemon_socket(args, "config")
    if socket is not None:
        from urllib.parse import quote

        from affidavit.api.wire import approval_path

        response = ask_daemon(socket, "GET", approval_path(iid, f"/content/{quote(name, safe='')}"))
        if response.status != 200:
            raise _refused(response.error())
        data = response.body
    else:
        from affidavit import approvals

        data = _reading(args, lambda j: approvals.content(j, iid, name), f"the approval of {iid}")
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


def _decide(args: argparse.Namespace) -> int:
    iid = text_arg(args.invocation_id, "the invocation id")
    note = text_arg(args.note, "--note")
    assert iid is not None
    socket = daemon_socket(args, "config")
    if socket is not None:
        from affidavit.api.wire import approval_path

        path = approval_path(iid, f"/{args.verb}")
        body: dict[str, Any] = {"note": note, **({"blind": True} if args.blind else {})}
        _print(_daemon_answer(socket, "POST", path, body))
        return 0

    async def decide(broker: Any) -> Any:
        if args.verb == "approve":
            return await broker.approve(iid, note=note, blind=args.blind)
        if args.verb == "revoke":
            return await broker.revoke(iid, note=note)
        return await broker.deny(iid, note=note)

    from affidavit.approvals import service

    _print(_embedded(args, decide, lambda exc: service.decision_failure(exc, iid, operator=True)))
    return 0


# --- reconcile -----------------------------------------------------------------------------------


def _reconcile(args: argparse.Namespace) -> int:
    iid = text_arg(args.invocation_id, "the invocation id")
    note = text_arg(args.note, "--note")
    assert iid is not None
    args.timeout = timeout_arg(args.timeout)
    if args.attest is not None and not (note or "").strip():
        raise UsageError("required with --attest: say what you checked", "NOTE_REQUIRED", "--note")
    if args.query and note is not None:
        raise UsageError("only with --attest: a query records no note", "INVALID_FIELD", "--note")
    socket = daemon_socket(args, "config")
    if socket is not None:
        from affidavit.api.wire import invocation_path, target

        body = {"query": True} if args.query else {"attest": args.attest, "note": note}
        path = target(invocation_path(iid, "/reconcile"), {"timeout": args.timeout})
        answer = _daemon_answer(socket, "POST", path, body)
    else:

        async def reconcile(broker: Any) -> Any:
            return await broker.reconcile(
                iid,
                query=args.query,
                attest=args.attest,
                note=note,
                timeout=args.timeout,
                as_operator=True,  # the journal's owner, run here: `affidavit record` reads it
            )

        from affidavit.reconcile import service

        answer = _embedded(args, reconcile, lambda exc: service.failure(exc, iid, operator=True))
    _print(answer)
    return 0 if answer["reconciled"] else 1


def _print(value: Any) -> None:
    sys.stdout.write(json.dumps(value, sort_keys=True, indent=2) + "\n")
