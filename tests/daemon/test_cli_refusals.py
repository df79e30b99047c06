"""A refusal prints one shape whether the command line asks the daemon on its socket or runs
embedded: ``affidavit: CODE: [field: ]message`` on stderr, exit status 2, never a traceback.
Through the socket the daemon's ``api_error`` code used to be dropped (``affidavit: no
approval was requested for ...``) where embedded printed it.  One refusal per command family
that can run through the daemon, each run both ways against a real daemon's unix socket and,
once it is stopped, embedded on the same journal.  Under ``--json`` a refusal is also one
``{"api_error": {...}}`` object on stdout -- the daemon's own API error shape -- identical both
ways; before, stdout was empty and a script had only the stderr line to parse."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import trio

from tests.http.hostile import HostileServer, Reply, scripts

from .kit import (
    PYTHON,
    DaemonProc,
    Run,
    api_target,
    cli,
    client_env,
    embedded,
    start_daemon,
    stop,
    write_daemon_config,
)

NOPE = "act_01J00000000000000000000000"
CASES: list[tuple[tuple[str, ...], str | None]] = [
    # Argument refusals checked before any request: once without a code.
    (("reconcile", NOPE, "--attest", "committed"), "NOTE_REQUIRED"),  # no --note
    (("result", NOPE, "--stream", "body"), "INVALID_FIELD"),  # --stream goes with --raw
    (("approvals", "show", NOPE), "NO_SUCH_APPROVAL"),
    (("approvals", "show", NOPE, "--content", "body"), "NO_SUCH_APPROVAL"),
    # A content name off the protocols' pattern: the daemon used to answer NOT_FOUND (no route).
    (("approvals", "show", NOPE, "--content", "Content-Type"), "NO_SUCH_APPROVAL"),
    (("approvals", "approve", NOPE, "--note", "checked"), "NO_SUCH_APPROVAL"),
    (("approvals", "deny", NOPE), "NO_SUCH_APPROVAL"),
    (("reconcile", NOPE, "--attest", "committed", "--note", "checked"), "NO_SUCH_INVOCATION"),
    (("reconcile", NOPE, "--query"), "NO_SUCH_INVOCATION"),
    (("result", NOPE), "NO_SUCH_INVOCATION"),
    (("record", NOPE), "NO_SUCH_INVOCATION"),
    (("record", NOPE, "--json"), "NO_SUCH_INVOCATION"),
    (("call", "--timeout", "0"), None),  # its words name the code: "INVALID_FIELD at timeout"
    (("call", "-"), None),  # "action refused: INVALID_FIELD at action: ..."
    (("actions", "--since", "bogus"), "INVALID_FIELD"),  # read here, either way
    (("result", NOPE, "--from-chunk", "x"), "INVALID_FIELD"),
    (("actions", "--session", "s\udcff"), "INVALID_FIELD"),  # argv bytes that are not UTF-8
    (("actions", "--since", "bogus", "--json"), "INVALID_FIELD"),
    (("actions", "--session", "s\udcff", "--json"), "INVALID_FIELD"),
    (("metrics", "--since", "bogus", "--json"), "INVALID_FIELD"),
]
FIELDS = {  # the field each --json refusal names (no key: it names none)
    ("actions", "--since", "bogus", "--json"): "--since",
    ("actions", "--session", "s\udcff", "--json"): "--session",
    ("metrics", "--since", "bogus", "--json"): "--since",
    ("record", NOPE, "--json"): "invocation_id",  # the argument naming nothing (its 404's)
}
LINE = re.compile(r"affidavit: (?:([A-Z][A-Z0-9_]+): )?(.*)\n")


def _shape(run: Run, journal: Path, *argv: str) -> tuple[int, str | None, str, object]:
    """(exit status, code, message, the JSON error) of one refusal: exactly one line on
    stderr; under ``--json`` also exactly one JSON object on stdout, else nothing there."""
    text = run.stderr.decode()
    assert "Traceback" not in text, run
    match = LINE.fullmatch(text)
    assert match is not None, text
    # Embedded, `result` names the journal's file; the daemon never tells where it lives.
    message = match[2].replace(str(journal), "the journal")
    if "--json" not in argv:
        assert run.stdout == b"", run
        return run.returncode, match[1], message, None
    out = run.stdout.decode("ascii")
    assert out.endswith("}\n") and out.count("\n") == 1, out
    error = json.loads(out)["api_error"]
    assert set(error) <= {"code", "message", "field"}, error
    # The same refusal as the stderr line: its code; its words, a leading field given apart.
    assert error["code"] == match[1], (error, text)
    lead = f"{error['field']}: " if "field" in error else ""
    assert match[2] in (lead + error["message"], error["message"]), (error, text)
    error["message"] = error["message"].replace(str(journal), "the journal")
    return run.returncode, match[1], message, error


async def test_each_refusal_has_the_same_code_field_and_status_both_ways(
    tmp_path: Path, token: str
) -> None:
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    service = {"operator_uids": [os.getuid()], "allow_self_approval": True}
    through: list[tuple[int, str | None, str]] = []
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket, service=service)
        daemon = await start_daemon(config, socket, log, token)
        try:
            for argv, _ in CASES:
                asked = await cli(daemon, *argv, stdin=b"{no")
                assert token.encode() not in asked.stdout + asked.stderr
                through.append(_shape(asked, daemon.journal, *argv))
        finally:
            stop(daemon)
        for (argv, code), asked in zip(CASES, through, strict=True):
            here = await embedded(*argv, "--config", str(config), stdin=b"{no", token=token)
            assert token.encode() not in here.stdout + here.stderr
            alone = _shape(here, daemon.journal, *argv)
            assert asked == alone, (argv, asked, alone)
            assert asked[:2] == (2, code), (argv, asked)
            if "--json" in argv:
                assert isinstance(asked[3], dict) and asked[3].get("field") == FIELDS.get(argv)
        assert srv.requests == []
    # Nobody answers on the socket any more: the code MCP gives it, not the message alone.
    gone = _shape(await cli(daemon, "approvals", "show", NOPE), daemon.journal)
    assert gone[:2] == (2, "DAEMON_UNAVAILABLE"), gone


def _to_a_terminal(argv: list[str]) -> Run:
    """``argv`` with its stdout a terminal (a pty), stderr captured (bounded)."""
    main, tty = os.openpty()
    try:
        done = subprocess.run(
            argv, stdout=tty, stderr=subprocess.PIPE, env=client_env(), check=False, timeout=60
        )
    finally:
        os.close(tty)
        os.close(main)
    return Run(done.returncode, b"", done.stderr)


async def test_raw_bytes_to_a_terminal_and_raw_through_the_socket_are_refused_with_a_code(
    tmp_path: Path, token: str
) -> None:
    """``result --raw`` and ``approvals show --content`` refuse a terminal before asking
    anyone: ``RAW_TO_TERMINAL``, through the socket and embedded alike.  ``--raw`` through the
    socket (the daemon serves envelopes) is ``INVALID_FIELD``.  Each used to have no code."""
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)
        daemon: DaemonProc = await start_daemon(config, socket, log, token)
        try:
            piped = _shape(await cli(daemon, "result", NOPE, "--raw"), daemon.journal)
            assert piped[:3] == (
                2,
                "INVALID_FIELD",
                "--raw reads the journal itself; the daemon serves envelopes",
            )
            for argv in (("result", NOPE, "--raw"), ("approvals", "show", NOPE, "--content", "b")):
                for way in (("--socket", str(socket)), ("--config", str(config))):
                    command = [PYTHON, "-m", "affidavit", *argv, *way]
                    run = await trio.to_thread.run_sync(_to_a_terminal, command)
                    assert token.encode() not in run.stderr
                    shown = _shape(run, daemon.journal)
                    assert shown[:2] == (2, "RAW_TO_TERMINAL"), (argv, way, shown)
                    assert "redirect it to a file" in shown[2], shown
        finally:
            stop(daemon)
        assert srv.requests == []


async def test_options_for_the_other_way_are_refused_at_the_option_under_json(
    tmp_path: Path, token: str
) -> None:
    """``--journal`` beside a socket and ``--daemon-uid`` without one had no code: now
    ``INVALID_FIELD`` at the option, and under ``--json`` the object names it too."""
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        config = write_daemon_config(tmp_path, api_target(srv.url), socket=socket)
        daemon = await start_daemon(config, socket, log, token)
        try:
            beside = await cli(daemon, "actions", "--json", "--journal", "j.db")
        finally:
            stop(daemon)
    alone = await embedded("actions", "--json", "--daemon-uid", "0", "--config", str(config))
    for run, field in ((beside, "--journal"), (alone, "--daemon-uid")):
        assert token.encode() not in run.stdout + run.stderr
        shown = _shape(run, daemon.journal, "--json")
        assert shown[:2] == (2, "INVALID_FIELD"), shown
        assert isinstance(shown[3], dict) and shown[3]["field"] == field, shown
