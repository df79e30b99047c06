"""Every refusal of the socket that names a part of the request to correct says which, in
``"field"``, in the socket's own terms: a body's key (``query``, ``attest``, ``note``), the
path's id (``invocation_id``) or content ``name`` -- never the command line's spelling
(``--attest``, ``--note``, ``--blind``), which an agent on the socket or behind MCP has no use
for.  The command line, the same refusal embedded or through the socket, names its own option
(``--content``) instead."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import trio

from affidavit.approvals.service import MAX_NOTE
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import HUNG, api_target, ask, cli, embedded, start_daemon, stop, write_daemon_config

NOPE = "act_01J00000000000000000000000"
CLI_FLAG = re.compile(r"(?<![\w-])--[a-z]")


async def test_each_refusal_names_the_sockets_own_field(tmp_path: Path, token: str) -> None:
    socket, log = tmp_path / "affidavit.sock", tmp_path / "daemon.log"
    service = {"operator_uids": [os.getuid()], "allow_self_approval": True}
    async with HostileServer.running(scripts.serve(Reply(200, body=b"{}"))) as srv:
        target = api_target(srv.url, approval={"methods": ["POST"], "wait": "0s"})
        config = write_daemon_config(tmp_path, target, socket=socket, service=service)
        daemon = await start_daemon(config, socket, log, token)
        try:
            with trio.fail_after(HUNG):
                charge = {"target": "api", "method": "POST", "path": "/c", "body": "{}"}
                _s, _h, body = await ask(socket, "POST", "/v1/calls", json.dumps(charge).encode())
                pending = json.loads(body)
                assert pending["error"]["code"] == "APPROVAL_PENDING", pending
                iid = pending["invocation_id"]
                reconcile = f"/v1/invocations/{iid}/reconcile"
                cases = [
                    ("POST", reconcile, {}, 400, "BAD_REQUEST", "query"),
                    ("POST", reconcile, {"query": False}, 400, "BAD_REQUEST", "query"),
                    ("POST", reconcile, {"attest": "maybe", "note": "x"}, 400, "BAD_OUTCOME",
                     "attest"),
                    ("POST", reconcile, {"attest": "committed", "note": " "}, 400,
                     "NOTE_REQUIRED", "note"),
                    ("POST", reconcile, {"attest": "committed", "note": "x" * (MAX_NOTE + 1)},
                     400, "BAD_NOTE", "note"),
                    ("POST", f"/v1/approvals/{iid}/deny", {"note": "a\x1b[2Jb"}, 400,
                     "BAD_NOTE", "note"),
                    ("GET", f"/v1/approvals/{NOPE}", None, 404, "NO_SUCH_APPROVAL",
                     "invocation_id"),
                    ("POST", f"/v1/approvals/{NOPE}/deny", {}, 404, "NO_SUCH_APPROVAL",
                     "invocation_id"),
                    ("GET", f"/v1/approvals/{iid}/content/stdin", None, 404, "NO_SUCH_CONTENT",
                     "name"),
                    ("GET", f"/v1/invocations/{NOPE}", None, 404, "NO_SUCH_INVOCATION",
                     "invocation_id"),
                    ("GET", f"/v1/invocations/{NOPE}/result", None, 404, "NO_SUCH_INVOCATION",
                     "invocation_id"),
                ]  # fmt: skip
                answers = []
                for method, path, sent, *_ in cases:
                    data = b"" if sent is None else json.dumps(sent).encode()
                    status, _h, body = await ask(socket, method, path, data)
                    answers.append((status, json.loads(body)["api_error"]))
                through = await cli(daemon, "approvals", "show", iid, "--content", "stdin")
        finally:
            stop(daemon)
        here = await embedded(
            "approvals", "show", iid, "--content", "stdin", "--config", str(config), token=token
        )
        assert srv.requests == []
    for (method, path, sent, *expected), (status, error) in zip(cases, answers, strict=True):
        assert [status, error["code"], error.get("field")] == expected, (method, path, sent, error)
        if status == 400:  # the message leads with the field, as every 400 naming one
            assert error["message"].startswith(f"{error['field']}: "), error
        assert not CLI_FLAG.search(error["message"]), error  # no command line's option
    # The command line names its own option, the same line through the socket and embedded.
    line = f"affidavit: NO_SUCH_CONTENT: --content: the request of {iid} has no content 'stdin'\n"
    assert (through.returncode, through.stderr.decode()) == (2, line), through
    assert (here.returncode, here.stderr.decode()) == (2, line), here
