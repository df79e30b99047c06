"""``affidavit call``, ``affidavit result`` and ``affidavit init``.

Exit status: 0 when the envelope has no ``error`` and no batch item that is not ``committed``,
1 when it has one (``exit_status``), 2 for usage or config errors and for a journal that cannot
be used or a stored result that fails verification (message on stderr).  Exactly one envelope
is printed on stdout as JSON -- except for ``result --raw``, which writes one result stream's
bytes (never to a terminal: refused there, as ``approvals show --content`` is), each chunk
verified before it is written; a chunk that fails stops the output there (exit 2, the message
names the chunk).

With ``--socket PATH`` (or ``$AFFIDAVIT_SOCKET``) ``call`` and ``result`` ask the daemon and print
the very envelope it answers, in the same form and with the same exit status as embedded; the
process then loads neither the engine nor the config (it may have no right to read them).  A
daemon that cannot be reached is exit 2 as well, and so is one that sends no whole answer
within ``--timeout`` (else ``wire.CALL_WAIT``) and its delivery budget (``wire.answer_wait``),
or an answer that is no envelope (``ANSWER_LOST``: the call may have run).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable
from functools import partial

from affidavit.cli import (
    SECRETS_ALWAYS,
    SECRETS_EMBEDDED,
    DaemonSocket,
    Terminated,
    UsageError,
    add_socket_arg,
    ask_daemon,
    config_refusal,
    count_arg,
    daemon_json,
    daemon_refusal,
    daemon_socket,
    journal_refusal,
    refusal,
    stdin_bytes,
    text_arg,
    timeout_arg,
)

__all__ = ["acting", "add_commands", "load_or_usage", "run_journal"]

TYPE_CHECKING = False  # not typing's: see affidavit/__init__.py

if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")


def add_commands(sub: Any) -> None:
    p = sub.add_parser("call", help="perform one action and print its envelope")
    p.add_argument("action", nargs="?", default="-", help="action JSON file, or - for stdin")
    p.add_argument("--config", help="config file (default: $AFFIDAVIT_CONFIG or ./affidavit.toml)")
    p.add_argument(
        "--timeout", help="caller timeout in seconds (> 0, at most 100 years)", metavar="SECONDS"
    )
    add_socket_arg(p)
    p.set_defaults(handler=_call, holds_secrets=SECRETS_EMBEDDED)

    p = sub.add_parser("result", help="print the stored envelope of an invocation (no re-run)")
    p.add_argument("invocation_id")
    p.add_argument("--config")
    p.add_argument(
        "--from-chunk",
        metavar="N",
        help="resume: each result stream from chunk N on (the envelope gains result.resume)",
    )
    p.add_argument(
        "--raw",
        action="store_true",
        help="write the stored bytes of one stream to stdout, each chunk verified before it is "
        "written (no envelope; refused when stdout is a terminal: redirect or pipe it)",
    )
    p.add_argument(
        "--stream",
        metavar="NAME",
        help="with --raw: the stream to write (body; stdout or stderr); needed when the result "
        "has more than one",
    )
    add_socket_arg(p)
    p.set_defaults(handler=_result, holds_secrets=SECRETS_EMBEDDED)

    p = sub.add_parser("init", help="write a commented sample config and an empty journal")
    p.add_argument("--config", help="where to write the config (default: ./affidavit.toml)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an existing config with a new file (a link there is replaced, never "
        "followed)",
    )
    p.add_argument(
        "--journal-url",
        metavar="URL",
        help="a shared PostgreSQL journal (postgresql://user@host/db) instead of a SQLite file: "
        "its schema is created (or checked) now; keep the password in PGPASSWORD or ~/.pgpass",
    )
    p.set_defaults(handler=_init, holds_secrets=SECRETS_ALWAYS)


def load_or_usage(path: str | None) -> Any:
    from affidavit.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as exc:
        raise config_refusal(exc) from None
    except OSError as exc:
        raise UsageError(f"cannot read config: {exc.strerror}", "CONFIG_UNREADABLE") from None


WIRE_ACTION_LIMIT = 16 * 1024 * 1024
"""Bytes of action JSON sent to a daemon without asking it first: the least it takes
(``daemon.http.MAX_BODY``).  It checks the text as embedded ``call`` does, so this process
needs neither the config nor the parser."""


def _read_bytes(source: str, limit: int, more: Callable[[], int] | None = None) -> bytes:
    """At most ``limit`` bytes of action JSON from ``source`` (a file, or - for stdin): more is
    PAYLOAD_LIMIT, before anything is parsed -- unless ``more`` (asked once, only then) gives a
    larger limit to read on to."""
    try:
        if source == "-":
            stdin = stdin_bytes("cannot read action -: stdin is closed", "FILE_UNUSABLE")
            data = _read_on(stdin, limit, more)
        else:
            with open(source, "rb") as fh:
                data = _read_on(fh, limit, more)
    except OSError as exc:
        raise UsageError(f"cannot read action {source}: {exc.strerror}", "FILE_UNUSABLE") from None
    return data


def _read_on(fh: Any, limit: int, more: Callable[[], int] | None) -> bytes:
    data: bytes = fh.read(limit + 1)
    if len(data) > limit and more is not None:
        limit = max(limit, more())
        data += fh.read(limit + 1 - len(data))
    if len(data) > limit:
        raise refusal(
            f"action refused: PAYLOAD_LIMIT at action: is larger than {limit} bytes",
            "PAYLOAD_LIMIT",
        )
    return data


def _daemon_limit(socket: DaemonSocket) -> int:
    """The bytes of action JSON the daemon at ``socket`` takes: ``max_action_bytes`` of its
    catalog (what its targets accept, ``action_size_limit``) -- its body limit whenever that
    is above ``WIRE_ACTION_LIMIT``, the least it takes (``daemon.http.body_limit``)."""
    found = daemon_json(ask_daemon(socket, "GET", "/v1/catalog"))
    limit = found.get("max_action_bytes") if isinstance(found, dict) else None
    return limit if type(limit) is int else WIRE_ACTION_LIMIT


def _read_action(source: str, config: Any) -> Any:
    """The action JSON from ``source``, checked before it is parsed: size (what the configured
    targets accept), UTF-8, nesting depth, JSON syntax.  A refusal is a usage error naming its
    stable code (nothing was journaled or sent)."""
    from affidavit.protocols.actions import ActionInvalid, action_size_limit, load_action_json

    limit = action_size_limit(config.targets.values())
    try:
        return load_action_json(_read_bytes(source, limit), limit)
    except ActionInvalid as exc:
        raise refusal(
            f"action refused: {exc.code.value} at {exc.field}: {exc.message}", exc.code.value
        ) from None


def _print(envelope: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(envelope, sort_keys=True, indent=2) + "\n")
    sys.stdout.flush()


def _call(args: argparse.Namespace) -> int:
    # NaN or a negative deadline made trio.fail_after raise after ACTION_ACCEPTED was
    # journaled (a traceback, and a record never closed); 0 left the record open; inf passed
    # embedded but not through the daemon.  One parser, before anything, in both modes.
    args.timeout = timeout_arg(args.timeout)
    socket = daemon_socket(args, "config")
    if socket is not None:
        from affidavit.api.wire import answer_wait, target

        # A daemon takes what its targets accept, as embedded `call` does (at least
        # WIRE_ACTION_LIMIT): only an action larger than that costs asking it how much.
        body = _read_bytes(args.action, WIRE_ACTION_LIMIT, partial(_daemon_limit, socket))
        path = target("/v1/calls", {"timeout": args.timeout})
        # Its answer within --timeout (else CALL_WAIT) and the delivery budget: a daemon that
        # stops answering is ANSWER_LOST (exit 2), not a wait for ever.
        response = ask_daemon(socket, "POST", path, body, answer_wait(args.timeout))
        return _print_answer(_call_answer(daemon_json(response)))
    from affidavit.api.broker import Broker

    config = load_or_usage(args.config)
    action = _read_action(args.action, config)

    delivering = False

    async def deliver(envelope: dict[str, Any]) -> None:
        # Delivery is the write to stdout; a closed pipe is RESULT_DELIVERY_FAILED, and the
        # result stays fetchable with `affidavit result ID`.
        nonlocal delivering
        delivering = True
        _print(envelope)

    async def main() -> dict[str, Any]:
        from affidavit.engine import call_failure
        from affidavit.journal import ResultUnverified

        async with Broker.open(config=config) as broker:
            try:
                return await broker.call(action, timeout=args.timeout, deliver=deliver)
            except ResultUnverified as exc:  # a same-key replay: as the daemon answers it
                _status, code, message = call_failure(exc, None)
                raise UsageError(message, code) from None

    envelope = run_journal(main)
    if not delivering:
        # The engine calls ``deliver`` only for a stored remote result; every other envelope
        # (preflight, setup, unknown, busy) is printed here — exactly one envelope either way.
        _print(envelope)
    return exit_status(envelope)


def _result(args: argparse.Namespace) -> int:
    text_arg(args.invocation_id, "the invocation id")
    text_arg(args.stream, "--stream")
    args.from_chunk = count_arg(args.from_chunk, "--from-chunk")
    if args.stream is not None and not args.raw:
        raise UsageError("--stream goes with --raw", "INVALID_FIELD", "--stream")
    if args.raw and sys.stdout.isatty():
        # The remote's bytes, exactly: to a terminal, its ESC sequences would drive it.  Piping
        # through `cat` is the explicit way to want that anyway.
        raise UsageError(
            "--raw writes the remote's bytes: redirect it to a file or a pipe",
            "RAW_TO_TERMINAL",
            "--raw",
        )
    socket = daemon_socket(args, "config")
    if socket is not None:
        import trio

        from affidavit.api.pages import read_pages
        from affidavit.api.wire import (
            MAX_RESULT_PAGE_CHUNKS,
            ClientError,
            invocation_path,
            target,
        )

        if args.raw:
            raise UsageError(
                "--raw reads the journal itself; the daemon serves envelopes",
                "INVALID_FIELD",
                "--raw",
            )
        path = invocation_path(args.invocation_id, "/result")
        if args.from_chunk is None:
            return _print_answer(daemon_json(ask_daemon(socket, "GET", path)))

        async def page(at: int) -> Any:  # the daemon answers a page at a time: to the end
            page = {"from_chunk": at, "chunks": MAX_RESULT_PAGE_CHUNKS}
            # ``ApiError`` as itself: a 503 with Retry-After is asked again (``read_pages``).
            return ask_daemon(socket, "GET", target(path, page)).json()

        try:
            envelope = trio.run(read_pages, page, args.from_chunk)
        except ClientError as exc:  # the daemon's refusal, as every command says it
            raise daemon_refusal(exc) from None
        except ValueError as exc:  # no whole answer: as one cut short, ask again
            message = f"the daemon's pages of the result do not fit together ({exc}): ask again"
            raise UsageError(message, "ANSWER_LOST") from None
        assert envelope is not None  # (an unknown id is the daemon's 404: a UsageError)
        return _print_answer(envelope)
    from affidavit.api.broker import Broker

    config = load_or_usage(args.config)
    if args.raw:
        return run_journal(partial(_raw_result, config, args))
    delivering = False

    async def deliver(envelope: dict[str, Any]) -> None:
        # As for `call`: a stored result not yet delivered is delivered by this print.
        nonlocal delivering
        delivering = True
        _print(envelope)

    async def main() -> dict[str, Any] | None:
        from affidavit.journal import JournalError

        async with Broker.open(config=config) as broker:
            try:
                # The operator's read (the journal's owner): every target's, as ``record``.
                # Delivered only if this uid asked for it (``requested_by``): the operator
                # reading a call an agent made through the daemon reads it, recording nothing.
                return await broker.fetch_result(
                    args.invocation_id,
                    from_chunk=args.from_chunk,
                    deliver=deliver,
                    as_operator=True,
                    reader=os.getuid(),
                )
            except JournalError as exc:  # as the daemon answers it, not JOURNAL_UNUSABLE
                raise _result_refusal(exc, args.invocation_id) from None

    envelope = run_journal(main)
    if envelope is None:
        raise UsageError(
            f"no invocation {args.invocation_id} in {_where(config)}",
            "NO_SUCH_INVOCATION",
            "invocation_id",  # as the daemon's 404 names it: the argument to correct
        )
    if not delivering:
        _print(envelope)
    return exit_status(envelope)


def _where(config: Any) -> str:
    """The config's journal as messages name it (a URL without its password)."""
    from affidavit.journal.backend import where

    return where(config.journal.location)


def _print_answer(envelope: dict[str, Any]) -> int:
    _print(envelope)
    return exit_status(envelope)


def _call_answer(answer: Any) -> dict[str, Any]:
    """The daemon's answer to a call, when it is an envelope; else ``ANSWER_LOST`` (exit 2):
    a 200 that says nothing of the call is no outcome (``wire.check_envelope``)."""
    from affidavit.api.wire import ClientError, check_envelope

    try:
        return check_envelope(answer)
    except ClientError as exc:
        raise daemon_refusal(exc) from None


def exit_status(envelope: dict[str, Any]) -> int:
    """``call``'s and ``result``'s: 1 for an error envelope, and for a batch with an item not
    ``committed`` (rejected, unknown: ``wire.unsettled_items``) -- the call did not do all it
    was asked; else 0."""
    from affidavit.api.wire import unsettled_items

    return 1 if "error" in envelope or unsettled_items(envelope) else 0


def _result_refusal(exc: Exception, invocation_id: str) -> UsageError:
    """A read of a stored result that met a ``JournalError`` (``result_failure``): the code
    and words the daemon answers for it -- RESULT_UNVERIFIED for a result that fails its
    verification -- so ``affidavit result`` says the same embedded and through the socket."""
    from affidavit.engine import result_failure

    _status, code, message = result_failure(exc, invocation_id, operator=True)
    return UsageError(message, code)


def _past_the_end(start: int, what: str, count: int) -> UsageError:
    """``result --raw --from-chunk`` beyond the stream's end (``CHUNK_OUT_OF_RANGE``): the
    chunks there are, 0 to ``count - 1``; ``count`` itself is the end (nothing left)."""
    held = f"has chunks 0 to {count - 1}" if count else "has no chunks"
    return refusal(
        f"CHUNK_OUT_OF_RANGE at from_chunk: {what} {held}; --from-chunk {start} is past its "
        f"end (give 0 to {count}; {count} is the end: nothing left)",
        "CHUNK_OUT_OF_RANGE",
    )


async def _raw_result(config: Any, args: argparse.Namespace) -> int:
    """``result --raw``: one stream's stored bytes, verified chunk by chunk as they are written.
    A chunk that fails verification stops the output there: nothing of it is written, and the
    message (exit 2) says which chunk and how much was written before it.  A ``--from-chunk``
    past the stream's end is ``CHUNK_OUT_OF_RANGE`` (exit 2), naming the chunks there are."""
    from affidavit.api.broker import Broker
    from affidavit.journal import JournalError

    iid = args.invocation_id
    start = args.from_chunk or 0
    async with Broker.open(config=config) as broker:
        try:  # the marker and summary, verified; else the stored envelope
            stored = broker.result_stream(iid)
            envelope = (
                await broker.fetch_result(iid, as_operator=True, reader=os.getuid())
                if stored is None
                else None
            )
        except JournalError as exc:
            raise _result_refusal(exc, iid) from None
        if stored is None:
            if envelope is None:
                raise UsageError(
                    f"no invocation {iid} in {_where(config)}",
                    "NO_SUCH_INVOCATION",
                    "invocation_id",
                )
            err = envelope.get("error") or {}
            print(
                f"affidavit: invocation {iid} has no stored result (outcome "
                f"{err.get('outcome', '-')}, retry {err.get('retry', '-')})",
                file=sys.stderr,
            )
            return 1
        names = sorted(stored.streams)
        name = args.stream
        if name is None:
            if len(names) > 1:
                raise UsageError(
                    f"the result has streams {', '.join(names)}: pick one",
                    "INVALID_FIELD",
                    "--stream",
                )
            if not names:
                if start > 0:
                    raise _past_the_end(start, "the result has no stream", 0)
                return 0  # an empty result: no stream, no bytes
            name = names[0]
        if name not in stored.streams:
            raise UsageError(
                f"the result has no stream {name!r} (it has: {', '.join(names)})",
                "INVALID_FIELD",
                "--stream",
            )
        count = stored.streams[name].chunks
        if start > count:
            # Past the end: nothing to write, and an empty exit 0 read as "that was all".
            raise _past_the_end(start, f"stream {name!r}", count)
        out = sys.stdout.buffer
        written, index = 0, start
        try:
            for chunk in stored.chunks(name, start):
                out.write(chunk)
                out.flush()
                written += len(chunk)
                index += 1
        except JournalError as exc:
            out.flush()
            # A chunk that fails verification is RESULT_UNVERIFIED, as the daemon answers it;
            # a journal away, a read declined or a row altered, the daemon's code as well.
            stopped = _result_refusal(exc, iid)
            raise UsageError(
                f"{stopped} -- output stopped before chunk {index} of stream {name!r} "
                f"({index - start} verified chunks, {written} bytes written from chunk {start})",
                stopped.code,
            ) from None
        if args.from_chunk is None and names == [name]:
            # The only stream written whole (no --from-chunk), its last byte out: a whole
            # fetch, recorded as the daemon's is (delivered to this uid if it asked, else a
            # read recording nothing).  A read from any chunk is a page: it records nothing.
            await broker.fetch_result(
                iid, as_operator=True, reader=os.getuid(), deliver=_written, defer=True
            )
    return 0


async def _written(envelope: dict[str, Any]) -> None:
    """``result --raw``'s ``deliver``: its bytes are already written (nothing more to hand)."""


def run_journal(main: Callable[[], Awaitable[T]]) -> T:
    """``trio.run(main)``; a journal that cannot be used or a stored result that fails
    verification is a usage-level error (exit 2, one line), never a traceback -- as is a
    journal the daemon owns (``JournalLocked``: the message names its socket).

    SIGTERM (a supervisor's stop, ``timeout``, ``kill``) cancels ``main`` as Ctrl-C does:
    a call in progress records where it stood -- ``CALLER_CANCELLED``, ``unknown`` once
    dispatched -- before the process ends (``Terminated``, exit 143).  Its default action
    ended the process at once and left the record open until a daemon's start-up recovery."""
    import contextlib
    import signal

    import trio

    from affidavit.journal import JournalError

    async def guarded() -> T:
        # No nursery around ``main``: its exceptions (JournalError, UsageError...) must reach
        # the caller as themselves, not wrapped in an exception group.
        ended = False
        with trio.open_signal_receiver(signal.SIGTERM) as signals, trio.CancelScope() as scope:

            async def watch() -> None:
                # ``main`` ended before this task first ran, or as the signal came: the
                # receiver is closed (trio re-raises a signal it holds then).
                if ended:
                    return
                with contextlib.suppress(RuntimeError, KeyError):
                    async for _ in signals:
                        scope.cancel()
                        return

            trio.lowlevel.spawn_system_task(watch)  # cancelled when the run ends
            try:
                return await main()
            finally:
                ended = True
        raise Terminated  # only SIGTERM cancels ``scope``

    try:
        return trio.run(guarded)
    except JournalError as exc:
        raise journal_refusal(exc) from None


async def acting(
    config: Any,
    work: Callable[[Any], Awaitable[T]],
    failure: Callable[[Exception], tuple[int, str, str]],
) -> T:
    """``work(broker)`` in a broker of this process, for a command that acts on the journal
    (``operation poll``, ``approvals approve/deny``, ``reconcile``; inside ``run_journal``).
    A journal the open refused -- a daemon's (``JournalLocked``), one that cannot be used --
    is raised as itself: ``run_journal``'s code and words, as ``call`` says it (the act's
    ``failure`` called it JOURNAL_UNREADABLE, a journal it never read).  Once open, or a
    shared journal away (within reach of the act's words: what was not done), a
    ``JournalError`` is the act's ``failure`` (the daemon's words, then the journal's own:
    ``failure_line``)."""
    from affidavit.api.broker import Broker
    from affidavit.cli.journal import failure_line
    from affidavit.journal import JournalError, JournalUnavailable

    opened = False
    try:
        async with Broker.open(config=config) as broker:
            opened = True
            return await work(broker)
    except JournalError as exc:
        if not opened and not isinstance(exc, JournalUnavailable):
            raise
        answer = failure(exc)
        raise journal_refusal(exc, failure_line(exc, answer), answer[1]) from None


def _init(args: argparse.Namespace) -> int:
    from affidavit.config import config_path, sample_config
    from affidavit.config.sample import write_config
    from affidavit.journal import Journal
    from affidavit.privatefile import OwnerNotKept

    path = config_path(args.config)
    if os.path.lexists(path) and not args.force:  # a dangling link too: never followed
        raise UsageError(f"{path} exists; use --force to overwrite", "FILE_EXISTS")
    url = args.journal_url
    if url is not None and (
        not url.startswith(("postgresql://", "postgres://")) or any(c in url for c in '"\\\n')
    ):
        raise refusal("expected a postgresql:// URL", "INVALID_FIELD", "--journal-url")
    try:
        write_config(path, sample_config(url), replace=args.force)
    except FileExistsError:  # put there since the look above
        raise UsageError(f"{path} exists; use --force to overwrite", "FILE_EXISTS") from None
    except OwnerNotKept as exc:  # (before a byte is written) never a file quietly made ours
        raise UsageError(
            f"cannot replace {path} keeping its owner uid {exc.uid} and group gid {exc.gid}: "
            f"rerun as root, or `chown {os.geteuid()}:{os.getegid()} {shlex.quote(str(path))}` "
            "first for a config of this user's, or remove the file and run init again",
            "OWNER_NOT_KEPT",
        ) from None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}", "FILE_UNUSABLE") from None
    config = load_or_usage(str(path))
    file = None if config.journal.url else config.journal.path
    kept = file is not None and file.exists() and file.stat().st_size > 0

    async def create() -> None:
        async with Journal.open(
            config.journal.location,
            key_file=config.journal.key_file,
            signing_key=config.journal.signing_key,
            auditor_public_key=config.journal.auditor_public_key,
        ):
            pass

    try:
        run_journal(create)
    except UsageError as exc:  # the config stays: a rerun of the same command finds it there
        raise UsageError(
            f"{exc} ({path} is written all the same: the broker's first start opens the "
            "journal; `affidavit init --force` writes the config again)",
            exc.code,
            exc.field,
        ) from None
    if kept:  # --force rewrites the config, never a journal's records
        print(f"wrote {path}; kept the existing journal at {_where(config)} as it was")
    elif file is None:
        print(f"wrote {path}; the journal at {_where(config)} is created or checked")
    else:
        print(f"wrote {path} and an empty journal at {_where(config)}")
    print(
        f"checkpoints are signed with {config.journal.signing_key}; give auditors its public "
        "half: affidavit journal public-key --out journal.pub"
    )
    return 0
