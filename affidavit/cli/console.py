"""``affidavit console-url``: a one-time login link to the operator console (docs/console.md).

    affidavit console-url --socket PATH   ask the daemon: the socket peer must be an operator
    affidavit console-url [--config F]    embedded, as the daemon's user: this OS user must be
                                          an operator, and the socket listening on
                                          [service] console this user's (the daemon's)

The link holds a random token that logs in once, within five minutes; the session it opens is
the operator's who asked (the daemon records every decision taken there with that identity,
``via: console``).  Exit 0 with the URL on stdout; 2 refused (not an operator), no console
configured, or the daemon unreachable -- one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from affidavit.cli import (
    SECRETS_NONE,
    UsageError,
    add_socket_arg,
    ask_daemon,
    daemon_json,
    daemon_socket,
    refusal,
)

__all__ = ["add_commands"]


def add_commands(sub: Any) -> None:
    p = sub.add_parser(
        "console-url", help="print a one-time login link to the operator console (operators)"
    )
    p.add_argument("--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)")
    add_socket_arg(p)
    p.add_argument("--json", action="store_true", help='print {"url", "expires_at"}')
    # Holds no secret (docs/deployment.md, "Core files"): it loads no credential and no key,
    # and the link's token is no more than its own uid's -- it logs in once, within five
    # minutes, as the operator who asked: the uid this process runs as (embedded) or the
    # socket peer the daemon names (--socket).  This process's memory and its core file (0600)
    # are that uid's and root's, who can each ask for a link of their own; and a loopback
    # console serves a login only to that uid (docs/console.md, "Security model").
    p.set_defaults(handler=_console_url, holds_secrets=SECRETS_NONE)


def _console_url(args: argparse.Namespace) -> int:
    socket = daemon_socket(args, "config")
    if socket is not None:
        answer = daemon_json(ask_daemon(socket, "POST", "/v1/console/login", b"{}"))
    else:
        answer = _embedded(args)
    if args.json:
        sys.stdout.write(json.dumps(answer, sort_keys=True) + "\n")
    else:
        # The link expires TOKEN_TTL (300 s) after it was minted, a moment ago: the seconds
        # left rounded up name the moment it expires by ("within 300 s", as docs/console.md
        # shows it); a floor said 299 of a link minted milliseconds before.
        left = math.ceil(float(answer["expires_at"]) - time.time())
        print(answer["url"])
        # (a clock the daemon and this process disagree on can leave none: say so, not "0 s")
        said = f"within {left} s" if left > 0 else "already expired: ask for another"
        print(f"(one use, {said})", file=sys.stderr)
    return 0


def _embedded(args: argparse.Namespace) -> dict[str, Any]:
    from affidavit.approvals import Operator, OperatorError, OperatorPolicy
    from affidavit.cli.call import load_or_usage
    from affidavit.config import console_origin
    from affidavit.console import TokenStore, listener_owners, login_url, token_dir
    from affidavit.journal.lock import refuse_root_on_theirs

    config = load_or_usage(args.config)
    address = config.service.console
    if address is None:
        raise UsageError(
            "no [service] console in the config: ask the daemon that serves one "
            "(affidavit console-url --socket PATH)",
            "CONSOLE_UNAVAILABLE",
        )
    # Root minting beside another user's journal would make the token directory and its files
    # root's, 0700 and 0600: the daemon, their owner's, could then neither redeem nor mint a
    # link, nor remove them.  Refused before anything is made, as a root one-off writer of
    # that journal is (journal.lock: run as its owner); a root daemon mints through --socket.
    refuse_root_on_theirs(
        config.journal.path, (config.journal.key_file, config.journal.signing_key)
    )
    who = Operator.current()
    try:
        OperatorPolicy.of(config.service).require(who, "open the operator console")
    except OperatorError as exc:
        raise refusal(exc.message, exc.code, exc.field) from None
    # The link goes to whoever listens there: it must be this user's daemon (a port nobody
    # holds could be bound by any local user, who would then receive the login).
    owners = listener_owners(address)
    if owners != {os.geteuid()}:
        where = console_origin(*address)
        raise UsageError(
            f"nothing listens on {where}: is the daemon running? (or ask it: --socket PATH)"
            if not owners
            else f"{where} is served by uid {', '.join(map(str, sorted(owners)))}, not by this "
            f"user's (uid {os.geteuid()}) daemon: no login link is sent there",
            "CONSOLE_UNAVAILABLE",
        )
    try:
        token, expires = TokenStore(token_dir(config.journal.path)).mint(who)
    except OSError as exc:
        raise UsageError(
            f"cannot write a login token beside the journal: {exc.strerror or exc} "
            "(run as the daemon's user, or use --socket)",
            "FILE_UNUSABLE",
        ) from None
    base = config.service.console_public_origin or console_origin(*address)
    return {"url": login_url(base, token), "expires_at": expires}
