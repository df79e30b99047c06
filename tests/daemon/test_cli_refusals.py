"""A refusal prints one shape whether the command line asks the daemon on its socket or runs
embedded: ``affidavit: CODE: [field: ]message`` on stderr, exit status 2, never a traceback.
Through the socket the daemon's ``api_error`` code used to be dropped (``affidavit: no
approval was requested for ...``) where embedded printed it.  One refusal per command family
that can run through the daemon, each run both ways against a real daemon's unix socket and,
once it is stopped, embedded on the same journal."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.http.hostile import HostileServer, Reply, scripts

from .kit import Run, api_target, cli, embedded, start_daemon, stop, write_daemon_config

NOPE = "act_01J00000000000000000000000"
CASES: list[tuple[tuple[str, ...], str | None]] = [
    (("approvals", "show", NOPE), "NO_SUCH_APPROVAL"),
    (("approvals", "show", NOPE, "--content", "body"), "NO_SUCH_APPROVAL"),
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
]
LINE = re.compile(r"affidavit: (?:([A-Z][A-Z0-9_]+): )?(.*)\n")


def _shape(run: Run, journal: Path) -> tuple[int, str | None, str]:
    """(exit status, code, message) of one refusal: exactly one line on stderr."""
    text = run.stderr.decode()
    assert "Traceback" not in text and run.stdout == b"", run
    match = LINE.fullmatch(text)
    assert match is not None, text
    # Embedded, `result` names the journal's file; the daemon never tells where it lives.
    return run.returncode, match[1], match[2].replace(str(journal), "the journal")


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
                through.append(_shape(await cli(daemon, *argv, stdin=b"{no"), daemon.journal))
        finally:
            stop(daemon)
        for (argv, code), asked in zip(CASES, through, strict=True):
            here = await embedded(*argv, "--config", str(config), stdin=b"{no", token=token)
            alone = _shape(here, daemon.journal)
            assert asked == alone, (argv, asked, alone)
            assert asked[:2] == (2, code), (argv, asked)
        assert srv.requests == []
    # Nobody answers on the socket any more: the code MCP gives it, not the message alone.
    gone = _shape(await cli(daemon, "approvals", "show", NOPE), daemon.journal)
    assert gone[:2] == (2, "DAEMON_UNAVAILABLE"), gone
