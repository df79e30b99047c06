"""``affidavit operations`` and ``affidavit operation poll ID``: jobs a complete 202 accepted,
tracked as operations of their own (docs/configuration.md, "Asynchronous jobs").

``operations`` reads the journal only (read-only, no key); a journal it cannot read exits 2
naming what (``read_failure``'s words: a shared journal away "cannot be read now", then the
journal's own).  ``operation poll`` runs one linked invocation that queries the job's status
resource (``Broker.poll_operation``) and prints ``{"operation": ..., "poll": the poll's
envelope or null}`` (and ``"refused"`` when the poll's answer was not recorded).

Exit status: 0 the poll read the job's state (or the job had already ended: nothing was sent);
1 the poll got no readable answer and the state was kept, or its answer was not recorded
(``refused``, POLL_SUPERSEDED: the operation shows another asker's poll, not this one); 2
usage or config error (an unknown operation, or one with no status resource the broker may
query; a poll refused for now, its message saying when to poll again: POLL_PENDING,
POLL_TOO_SOON), a journal that could not take the poll (``poll_failure``'s words, then the journal's
own: a shared journal away at the opening too) or that could not be opened (the daemon's,
unusable...: ``run_journal``'s codes, as ``call`` says them); 143 SIGTERM stopped it, the
poll's own record closed where it stood (``run_journal``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from affidavit.cli import (
    SECRETS_ALWAYS,
    SECRETS_NONE,
    UsageError,
    text_arg,
    timeout_arg,
)
from affidavit.cli.call import acting, load_or_usage, run_journal
from affidavit.cli.journal import common_options, print_json, reading

__all__ = ["add_commands", "poll_exit"]


def add_commands(sub: Any) -> None:
    p = sub.add_parser("operations", help="list the jobs 202 responses accepted, with their state")
    common_options(p)
    p.set_defaults(handler=_list, holds_secrets=SECRETS_NONE)

    op = sub.add_parser("operation", help="one job accepted by a 202")
    osub = op.add_subparsers(dest="operation_command", metavar="OPERATION_COMMAND")
    osub.required = True
    poll = osub.add_parser(
        "poll", help="query the job's status resource once, as a linked invocation"
    )
    poll.add_argument("operation_id")
    poll.add_argument(
        "--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)"
    )
    poll.add_argument(
        "--timeout", help="caller timeout in seconds for the query", metavar="SECONDS"
    )
    poll.set_defaults(handler=_poll, holds_secrets=SECRETS_ALWAYS)


def _list(args: argparse.Namespace) -> int:
    # Imported here, as in every command module: every command's parser imports this one.
    from affidavit.statemachine import operation_json

    with reading(args, "the operations view") as j:
        ops = [operation_json(r) for r in j.list_actions() if r.operation is not None]
    if args.json:
        print_json(ops)
        return 0
    from affidavit.text import cell

    print(f"{'OPERATION':29} {'STATE':10} {'POLLS':>5}  {'JOB':24} SUBMITTED BY")
    for o in ops:
        # Each cell by ``cell``: the job id is the remote's (up to 256 characters, spaces
        # allowed), and must neither start a row, look like other columns nor drive the terminal.
        print(
            f"{cell(o['id'], 29)} {cell(o['state'], 10)} {cell(o['polls'], 5, right=True)}  "
            f"{cell(o['job_id'] or '-', 24)} {cell(o['invocation_id'], 0)}"
        )
    return 0


def _poll(args: argparse.Namespace) -> int:
    from affidavit.api.broker import Broker
    from affidavit.engine import OperationError, poll_failure

    op_id = text_arg(args.operation_id, "the operation id")
    assert op_id is not None
    args.timeout = timeout_arg(args.timeout)
    config = load_or_usage(args.config)

    async def poll(broker: Broker) -> dict[str, Any]:
        # The journal's owner, run here: every operation, as `affidavit operations` lists them.
        return await broker.poll_operation(op_id, timeout=args.timeout, as_operator=True)

    async def main() -> dict[str, Any]:
        try:  # a journal that failed it: the daemon's words, then the journal's (``acting``)
            return await acting(config, poll, lambda exc: poll_failure(exc, op_id, operator=True))
        except OperationError as exc:  # the daemon's 422 code, here as through it
            raise UsageError(str(exc), exc.code, exc.field) from None

    # As every embedded journal command: SIGTERM closes the poll's record where it stood (exit
    # 143), a journal that cannot be opened (the daemon's, unusable) is its own code.
    answer = run_journal(main)
    sys.stdout.write(json.dumps(answer, sort_keys=True, indent=2) + "\n")
    return poll_exit(answer)


def poll_exit(answer: dict[str, Any]) -> int:
    """``operation poll``'s exit status for ``answer`` (the module's list): 1 whenever it
    carries ``refused`` -- its ``last_poll`` may then be another asker's poll, which read a
    state this one did not (as ``reconcile`` exits 1 on ``refused``)."""
    if "refused" in answer:
        return 1
    last = answer["operation"]["last_poll"] or {}
    return 0 if answer["poll"] is None or "state" in last else 1
