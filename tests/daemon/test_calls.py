"""Calls through a real daemon: the command line, ``affidavit.Client`` and ``curl --unix-socket``
get the same envelopes; the thin clients print what the embedded commands print, byte for byte.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.api.client import Client
from affidavit.journal import JournalReader
from affidavit.sdk import AffidavitError, call_checked
from affidavit.views import record_json_encoder
from tests.http.hostile import Reply, scripts

from .kit import action, action_bytes, cli, curl_api, embedded, serving

OK = Reply(200, headers=[("Content-Type", "application/json")], body=b'{"balance": 42}')


def _printed(envelope: dict[str, object]) -> bytes:
    """What ``affidavit call`` prints for an envelope."""
    return (json.dumps(envelope, sort_keys=True, indent=2) + "\n").encode()


async def test_the_cli_the_client_and_curl_call_through_the_daemon(
    tmp_path: Path, token: str, curl: str
) -> None:
    async with serving(tmp_path, scripts.serve(OK), token=token) as (srv, daemon):
        by_cli = await cli(daemon, "call", "-", stdin=action_bytes())
        assert by_cli.returncode == 0, by_cli.stderr
        from_cli = by_cli.json()
        assert by_cli.stdout == _printed(from_cli)

        async with Client.open(daemon.socket) as client:
            from_client = await client.call(action())
            stored = await client.fetch_result(from_cli["invocation_id"])
            record = await client.record(from_cli["invocation_id"])

        status, from_curl = await curl_api(curl, daemon.socket, "/v1/calls", action_bytes())
        assert status == 200

        for envelope in (from_cli, from_client, from_curl):
            assert "error" not in envelope, envelope
            assert envelope["result"]["status"] == 200
            assert json.loads(envelope["result"]["body"]) == {"balance": 42}
        assert len({e["invocation_id"] for e in (from_cli, from_client, from_curl)}) == 3
        # The remote saw three requests, each with the credential the daemon injected.
        assert [r.header("authorization") for r in srv.requests] == [f"Bearer {token}"] * 3
        assert stored is not None and stored["result"] == from_cli["result"]
        assert record is not None and record["outcome"] == "committed"


async def test_an_error_envelope_is_http_200_and_exit_status_1(tmp_path: Path, token: str) -> None:
    refused = Reply(403, body=b'{"error": "no"}')
    async with serving(tmp_path, scripts.serve(refused), token=token) as (_srv, daemon):
        by_cli = await cli(daemon, "call", "-", stdin=action_bytes())
        assert by_cli.returncode == 1
        envelope = by_cli.json()
        assert envelope["error"]["code"] == "REMOTE_REJECTED"
        assert envelope["error"]["outcome"] == "rejected"
        async with Client.open(daemon.socket) as client:
            try:
                await call_checked(client, action())
            except AffidavitError as err:
                assert (err.code, err.outcome) == ("REMOTE_REJECTED", "rejected")
            else:
                raise AssertionError("call_checked did not raise for an error envelope")


async def test_the_views_print_the_same_bytes_through_the_daemon_as_embedded(
    tmp_path: Path, token: str
) -> None:
    """``record``, ``actions``, ``sessions`` and ``metrics`` in every output form: the socket
    and an embedded read-only view of the same journal print identical bytes -- but for the
    lease holder, which the socket (a caller's view) shows as its tag and the embedded view (the
    operator's) as recorded (docs/contract.md, "The lease holder")."""
    async with serving(tmp_path, scripts.serve(OK), token=token) as (_srv, daemon):
        first = (await cli(daemon, "call", "-", stdin=action_bytes(session="s1"))).json()
        await cli(daemon, "call", "-", stdin=action_bytes("/v1/other", session="s2"))
        iid = first["invocation_id"]
        key_file = Path(f"{daemon.journal}.key")
        with JournalReader.open(daemon.journal, key_file=key_file) as r:
            recorded = r.events(iid)[0].attrs["holder"]
            shown = r.holder_tag(iid, recorded)
        assert first["evidence"]["lease"]["holder"] == shown != recorded
        forms = [
            ("record", iid),
            ("record", iid, "--json"),
            ("actions",),
            ("actions", "--json", "--session", "s1"),
            ("actions", "--outcome", "committed", "--since", "2000-01-01T00:00:00Z"),
            ("sessions",),
            ("sessions", "--json"),
            ("metrics",),
            ("metrics", "--json"),
            ("metrics", "--prometheus", "--session", "s2"),
        ]
        for form in forms:
            through = await cli(daemon, *form)
            local = await embedded(*form, "--journal", str(daemon.journal))
            assert through.returncode == local.returncode == 0, (form, through.stderr)
            assert through.stdout == local.stdout.replace(recorded.encode(), shown.encode()), form
            assert through.stdout, form
        # The daemon's answer is the records as `actions --json` encodes them, one per item.
        from affidavit.api.wire import blocking_request

        got = await trio.to_thread.run_sync(
            blocking_request, str(daemon.socket), "GET", "/v1/actions?session=s1"
        )
        with JournalReader.open(daemon.journal, key_file=key_file) as r:
            encode = record_json_encoder(holder=r.holder_tag)
            texts = [encode(rec) for rec in r.list_actions(session="s1")]
        page = f'"limit":1000,"total":{len(texts)},"truncated":false}}\n'
        want = ('{"actions":[' + ",".join(texts) + "]," + page).encode()
        assert got.status == 200 and got.body == want


async def test_the_same_refusal_both_ways_for_an_unknown_invocation(
    tmp_path: Path, token: str
) -> None:
    async with serving(tmp_path, scripts.serve(OK), token=token) as (_srv, daemon):
        through = await cli(daemon, "record", "act_NOPE")
        local = await embedded("record", "act_NOPE", "--journal", str(daemon.journal))
        assert (through.returncode, through.stderr) == (local.returncode, local.stderr)
        assert through.returncode == 2
        # The argument to correct named both ways (the daemon's 404 names it: ``field``).
        head = b"affidavit: NO_SUCH_INVOCATION: invocation_id: no invocation act_NOPE"
        assert through.stderr.startswith(head), through.stderr
        via_socket = await cli(daemon, "result", "act_NOPE")
        from affidavit.api.wire import blocking_request

        raw = await trio.to_thread.run_sync(
            blocking_request, str(daemon.socket), "GET", "/v1/invocations/act_NOPE/result"
        )
        assert (raw.status, raw.error().code) == (404, "NO_SUCH_INVOCATION"), raw
        assert raw.error().field == "invocation_id", raw
        assert raw.error().message == "no invocation act_NOPE in the journal", raw
        assert str(daemon.journal).encode() not in raw.body, raw
    # `affidavit result` embedded writes the journal: only once the daemon has stopped.
    local = await embedded("result", "act_NOPE", "--config", str(daemon.config))
    # The same words, but for where the journal lives: the operator running it embedded may
    # be told; a socket caller (an agent) is not.
    assert via_socket.returncode == local.returncode == 2
    journal = str(daemon.journal).encode()
    assert local.stderr.replace(journal, b"the journal") == via_socket.stderr, local.stderr
    assert b"no invocation act_NOPE in the journal" in via_socket.stderr
    assert journal in local.stderr and journal not in via_socket.stderr


async def test_api_level_trouble_has_its_own_status_and_never_an_envelope(
    tmp_path: Path, token: str
) -> None:
    async with serving(tmp_path, scripts.serve(OK), token=token) as (srv, daemon):
        from affidavit.api.wire import blocking_request

        sock = str(daemon.socket)
        bad = await trio.to_thread.run_sync(blocking_request, sock, "POST", "/v1/calls", b"{nope")
        assert bad.status == 400 and bad.error().code == "BAD_JSON"
        # Nesting is checked before the parser runs (issue 9: a RecursionError before).
        deep = b"[" * 100_000 + b"]" * 100_000
        nested = await trio.to_thread.run_sync(blocking_request, sock, "POST", "/v1/calls", deep)
        assert nested.status == 400 and nested.error().code == "BAD_JSON"
        assert "nests deeper than" in str(nested.error())
        missing = await trio.to_thread.run_sync(blocking_request, sock, "GET", "/v1/nothing")
        assert missing.status == 404 and missing.error().code == "NOT_FOUND"
        wrong = await trio.to_thread.run_sync(blocking_request, sock, "GET", "/v1/calls")
        assert wrong.status == 405
        filt = await trio.to_thread.run_sync(
            blocking_request, sock, "GET", "/v1/actions?outcome=maybe"
        )
        assert filt.status == 400 and "outcome" in filt.error().message
        for response in (bad, missing, wrong, filt):
            assert "invocation_id" not in json.loads(response.body)
        assert srv.requests == []


async def test_a_resumed_result_is_the_same_through_the_daemon_as_embedded(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``affidavit result ID --from-chunk N`` (a read resuming an interrupted delivery): the
    daemon's pages put together are exactly what the embedded command prints -- four pages of
    one chunk here (the command run in this process, its page size made one chunk), a
    character cut by the first page's end; ``--raw`` stays embedded-only."""
    from affidavit.api import wire
    from affidavit.cli import call as cli_call
    from affidavit.cli import main
    from affidavit.engine import RESULT_CHUNK

    body = ("x" * (RESULT_CHUNK - 1) + "\u00e9" + "y" * (2 * RESULT_CHUNK)).encode()
    asked: list[str] = []
    ask = cli_call.ask_daemon

    def counted(socket: Any, method: str, target: str, *rest: Any) -> Any:
        asked.append(target)
        return ask(socket, method, target, *rest)

    served = scripts.serve(Reply(200, body=body))
    async with serving(tmp_path, served, token=token) as (_srv, daemon):
        iid = (await cli(daemon, "call", "-", stdin=action_bytes())).json()["invocation_id"]
        monkeypatch.setattr(wire, "MAX_RESULT_PAGE_CHUNKS", 1)
        monkeypatch.setattr(cli_call, "ask_daemon", counted)
        capsys.readouterr()
        argv = ["result", iid, "--from-chunk", "0", "--socket", str(daemon.socket)]
        code = await trio.to_thread.run_sync(main, argv)
        through = capsys.readouterr()
        raw = await cli(daemon, "result", iid, "--raw")
    local = await embedded("result", iid, "--from-chunk", "0", "--config", str(daemon.config))
    assert code == local.returncode == 0, through.err
    assert len(asked) == 4 and all("chunks=1" in t for t in asked), asked
    assert through.out.encode() == local.stdout
    assert json.loads(through.out)["result"]["body"] == body.decode()
    assert raw.returncode == 2 and b"--raw reads the journal itself" in raw.stderr


DUPLICATE = b'{"target":"nope","target":"api","method":"GET","path":"/v1/ok"}'
DUPLICATE_HEADER = b'{"target":"api","method":"GET","path":"/","headers":{"X":"a","X":"b"}}'


async def test_an_action_naming_a_field_twice_is_refused_the_same_both_ways(
    tmp_path: Path, token: str
) -> None:
    """A field named twice is refused at its path, never read as its last value: a proxy in
    front that reads the first ``target`` would see another target than the broker calls."""
    async with serving(tmp_path, scripts.serve(OK), token=token) as (srv, daemon):
        from affidavit.api.wire import blocking_request

        for body, field in [
            (DUPLICATE, "action.target"),
            (DUPLICATE_HEADER, "action.headers.X"),
            (b'{"target":"api","method":"GET","path":"/","n":NaN}', "action"),
            (b'{"target":"api","method":"GET","path":"/","n":-Infinity}', "action"),
        ]:
            answer = await trio.to_thread.run_sync(
                blocking_request, str(daemon.socket), "POST", "/v1/calls", body
            )
            assert answer.status == 400 and answer.error().code == "BAD_JSON", body
            assert f"INVALID_FIELD at {field}: " in answer.error().message, answer.error()
            through = await cli(daemon, "call", "-", stdin=body)
            local = await embedded("call", "-", "--config", str(daemon.config), stdin=body)
            assert through.returncode == local.returncode == 2, (through.stderr, local.stderr)
            assert through.stderr == local.stderr, (through.stderr, local.stderr)
            assert through.stdout == local.stdout == b""
        assert not srv.requests


async def test_a_bad_timeout_is_refused_in_the_same_words_both_ways(
    tmp_path: Path, token: str
) -> None:
    """One parser (``wire.parse_timeout``): ``--timeout inf`` ran embedded but was refused
    through the socket, and ``?timeout=1e308`` was taken; 0 left the record open."""
    from affidavit.api.wire import TIMEOUT_RULE, blocking_request

    async with serving(tmp_path, scripts.serve(OK), token=token) as (srv, daemon):
        for value in ("0", "inf", "1e308", "9" * 26, "-1", "nan"):
            answer = await trio.to_thread.run_sync(
                blocking_request,
                str(daemon.socket),
                "POST",
                f"/v1/calls?timeout={value}",
                action_bytes(),
            )
            assert answer.status == 400, (value, answer)
            assert (answer.error().code, answer.error().message) == ("INVALID_FIELD", TIMEOUT_RULE)
            through = await cli(daemon, "call", "-", "--timeout", value, stdin=action_bytes())
            local = await embedded(
                "call",
                "-",
                "--timeout",
                value,
                "--config",
                str(daemon.config),
                stdin=action_bytes(),
            )
            assert through.returncode == local.returncode == 2, (value, through.stderr)
            assert through.stderr == local.stderr == f"affidavit: {TIMEOUT_RULE}\n".encode()
        assert not srv.requests
        # A positive deadline spent before dispatch is the caller's, and the record is closed.
        short = await cli(daemon, "call", "-", "--timeout", "1e-9", stdin=action_bytes())
        assert short.returncode == 1
        err = short.json()["error"]
        assert (err["code"], err["outcome"]) == ("CALLER_CANCELLED", "not_attempted"), err
        record = (await cli(daemon, "record", short.json()["invocation_id"], "--json")).json()
        assert record["record"]["state"] == "setup_failed", record["record"]


async def test_the_actions_view_answers_the_newest_limit_and_says_it_was_cut(
    tmp_path: Path, token: str
) -> None:
    """``GET /v1/actions`` holds a page, never the whole journal (an agent fills it cheaply):
    the newest ``limit`` (default 1000, at most 10000), with ``total`` and ``truncated``; a bad
    ``limit`` is 400 BAD_REQUEST naming it.  The metrics still count every record."""
    from affidavit.api.wire import blocking_request

    async with serving(tmp_path, scripts.serve(OK), token=token) as (_srv, daemon):
        async with Client.open(daemon.socket) as client:
            ids = [(await client.call(action(session="s1")))["invocation_id"] for _ in range(5)]
            cut = await client.actions(limit=2)
            whole = await client.actions(session="s1")
            counted = await client.metrics()
        sock = str(daemon.socket)
        bad = [
            await trio.to_thread.run_sync(blocking_request, sock, "GET", f"/v1/actions?limit={v}")
            for v in ("10001", "-1", "two", "1e3")
        ]
        through = await cli(daemon, "actions", "--json")
    assert [r["invocation_id"] for r in cut["actions"]] == ids[-2:]
    assert (cut["limit"], cut["total"], cut["truncated"]) == (2, 5, True)
    assert [r["invocation_id"] for r in whole["actions"]] == ids
    assert (whole["limit"], whole["total"], whole["truncated"]) == (1000, 5, False)
    assert counted["invocations"] == 5
    for response in bad:
        assert response.status == 400, response.body
        error = response.error()
        assert error.code == "BAD_REQUEST" and error.message.startswith("limit: "), error
    assert through.returncode == 0 and through.stderr == b""
    assert [r["invocation_id"] for r in json.loads(through.stdout)] == ids


async def test_an_action_the_targets_accept_goes_through_the_daemon_as_embedded(
    tmp_path: Path, token: str
) -> None:
    """The daemon's body limit follows its config as embedded ``call`` does
    (``action_size_limit``: 6 x the largest ``max_body`` + 1 MiB, a body may be JSON-escaped),
    never less than 16 MiB.  Before, it was a fixed 16 MiB: a 3 MiB body written as ``\\u0041``
    escapes (18 MiB of JSON) for a target taking 4 MiB ran embedded, but the thin client
    refused it and the daemon answered 413.  Over the limit, both ways refuse it alike, and a
    declared length over it is 413 before a byte is read (another route's body keeps the
    16 MiB limit)."""
    from affidavit.protocols.actions import action_size_limit

    payload = 3 * 1024 * 1024
    limit = action_size_limit([type("T", (), {"max_body": 4 * 1024 * 1024})()])
    escaped = action_bytes("/v1/big", "PUT", body="\0" * payload).replace(b"\\u0000", b"\\u0041")
    assert 16 * 1024 * 1024 < len(escaped) < limit
    async with serving(
        tmp_path, scripts.serve(OK), token=token, overrides={"max_body": 4 * 1024 * 1024}
    ) as (srv, daemon):
        through = await cli(daemon, "call", "-", stdin=escaped)
        assert through.returncode == 0, through.stderr
        assert through.json()["result"]["status"] == 200
        assert [r.body for r in srv.requests] == [b"A" * payload]

        over = b" " * (limit - len(escaped) + 1) + escaped
        refused = await cli(daemon, "call", "-", stdin=over)
        local = await embedded("call", "-", "--config", str(daemon.config), stdin=over)
        assert refused.returncode == local.returncode == 2, (refused.stderr, local.stderr)
        assert refused.stderr == local.stderr, (refused.stderr, local.stderr)
        assert b"PAYLOAD_LIMIT" in refused.stderr

        # No byte of a body is sent: the daemon answers the declared length, then closes.  Only
        # an action may be that large: another route's body still takes 16 MiB.
        small = 16 * 1024 * 1024
        for path, declared, most in [
            (b"/v1/calls", limit + 1, limit),
            (b"/v1/invocations/act_x/reconcile", small + 1, small),
        ]:
            stream = await trio.open_unix_socket(str(daemon.socket))
            async with stream:
                head = b"POST %s HTTP/1.1\r\nhost: a\r\ncontent-length: %d\r\n\r\n"
                await stream.send_all(head % (path, declared))
                answer = b""
                with trio.fail_after(10):
                    while chunk := await stream.receive_some():
                        answer += chunk
            status, _, body = answer.partition(b"\r\n\r\n")
            assert status.startswith(b"HTTP/1.1 413 "), answer
            error = json.loads(body)["api_error"]
            assert error == {"code": "BODY_TOO_LARGE", "message": f"the body exceeds {most} bytes"}
        assert len(srv.requests) == 1


async def test_the_sessions_view_answers_those_seen_last_and_says_it_was_cut(
    tmp_path: Path, token: str
) -> None:
    """``GET /v1/sessions`` answered every session, and a caller names its sessions: it is a
    page now, as ``/v1/actions`` is -- the ``limit`` seen last (default 1000, at most 10000)
    in order of first appearance, with ``total`` and ``truncated``; a bad ``limit`` is 400
    BAD_REQUEST naming it."""
    from affidavit.api.wire import blocking_request

    async with serving(tmp_path, scripts.serve(OK), token=token) as (_srv, daemon):
        async with Client.open(daemon.socket) as client:
            for name in ("s1", "s2", "s3", "s1"):  # s1 is seen last, s2 longest ago
                await client.call(action(session=name))
            cut = await client.sessions(limit=2)
            whole = await client.sessions()
        sock = str(daemon.socket)
        bad = [
            await trio.to_thread.run_sync(blocking_request, sock, "GET", f"/v1/sessions?limit={v}")
            for v in ("10001", "-1", "two")
        ]
        through = await cli(daemon, "sessions", "--json")
        local = await embedded("sessions", "--json", "--config", str(daemon.config))
    assert [s["session"] for s in cut["sessions"]] == ["s1", "s3"]
    assert (cut["limit"], cut["total"], cut["truncated"]) == (2, 3, True)
    assert [s["actions"] for s in cut["sessions"]] == [2, 1]
    assert [s["session"] for s in whole["sessions"]] == ["s1", "s2", "s3"]
    assert (whole["limit"], whole["total"], whole["truncated"]) == (1000, 3, False)
    for response in bad:
        assert response.status == 400, response.body
        error = response.error()
        assert error.code == "BAD_REQUEST" and error.message.startswith("limit: "), error
    assert through.returncode == 0 and through.stderr == b""
    assert through.stdout == local.stdout
    assert [s["session"] for s in json.loads(through.stdout)] == ["s1", "s2", "s3"]


async def test_the_views_kept_between_requests_answer_as_a_full_fold(
    tmp_path: Path, token: str
) -> None:
    """The daemon keeps ``/v1/sessions`` and ``/v1/metrics`` unfiltered, ``since`` a time or
    of a session (``SessionSummary``: the first request folds the journal, each later one only
    what was appended since): after each call, each body is the bytes a full fold of the
    journal makes (as before), and says the head it is as of."""
    from affidavit.api.wire import blocking_request
    from affidavit.daemon.http import json_body
    from affidavit.journal import JournalReader
    from affidavit.views import metrics, newest_sessions, prometheus_text

    pairs = []
    async with serving(tmp_path, scripts.serve(OK), token=token) as (_srv, daemon):
        sock = str(daemon.socket)

        async def get(path: str) -> bytes:
            got = await trio.to_thread.run_sync(blocking_request, sock, "GET", path)
            assert got.status == 200, got.body
            return bytes(got.body)

        async with Client.open(daemon.socket) as client:
            mark = time.time() + 3600.0  # (until the second call: none accepted since)
            for n, name in enumerate(("s1", "s2", "s1", "s3", "s2")):
                if n == 2:
                    mark = time.time()
                await client.call(action(session=name))
                for _ in range(100):  # (a delivery may still be written after the answer)
                    with JournalReader.open(daemon.journal) as r:
                        head = r.head()
                    kept = [
                        await get(p)
                        for p in (
                            "/v1/sessions?limit=2",
                            "/v1/metrics?format=json",
                            "/v1/metrics",
                            f"/v1/metrics?format=json&since={mark!r}",
                            f"/v1/metrics?format=json&session=s1&since={mark!r}",
                        )
                    ]
                    marks = [_without_as_of(kept, i) for i in (0, 1, 3, 4)]
                    with JournalReader.open(daemon.journal) as r:
                        counts = metrics(r.iter_actions())
                        full = [
                            json_body(newest_sessions(r.sessions(), 2)),
                            json_body(counts),
                            prometheus_text(counts).encode(),
                            json_body(metrics(r.iter_actions(since=mark))),
                            json_body(metrics(r.iter_actions(session="s1", since=mark))),
                        ]
                        if r.head() == head:  # all read from the same journal
                            break
                # Each kept answer says what it is as of: the head it folded through, and that
                # no whole verify has completed (the console's button runs one).
                assert marks == [as_of(head[0])] * 4, (marks, head)
                pairs.append((kept, full))
    for kept, full in pairs:
        assert kept == full
    assert json.loads(pairs[-1][0][0])["total"] == 3
    assert json.loads(pairs[-1][0][1])["invocations"] == 5
    assert json.loads(pairs[-1][0][3])["invocations"] == 3  # accepted since the mark


def as_of(through: int) -> dict[str, Any]:
    """A kept answer's marker (``SessionSummary.as_of``) with no whole verify completed."""
    return {
        "through": through,
        "verified_started_at": None,
        "verified_at": None,
        "verified_through": None,
        "verified_ok": None,
    }


def _without_as_of(bodies: list[bytes], i: int) -> Any:
    """The ``as_of`` of the JSON body ``bodies[i]``, taken out of it (the rest is compared with
    a full fold's bytes)."""
    from affidavit.daemon.http import json_body

    data = json.loads(bodies[i])
    mark = data.pop("as_of")
    bodies[i] = json_body(data)
    return mark
