"""Every tool through the real SDK client spawning ``affidavit mcp`` (embedded) over stdio,
against the scripted HTTP service: the envelope arrives as structured content beside its text
rendering, ``isError`` is true exactly when it carries an error, and the journal's record (read
back with ``get_record``) says the same."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.daemon.kit import wait_until

from .conftest import Remotes, wait_for
from .kit import Connected, connected, structured, wire_json
from .test_modes import MODES, session

ACTION_TOOLS = {"http_request"}
READ_TOOLS = {
    "fetch_result",
    "get_record",
    "list_targets",
    "list_actions",
    "poll_operation",
    "reconcile_query",
}


async def _record(mcp: Connected, iid: str) -> dict[str, Any]:
    answer = structured(await mcp.call("get_record", {"invocation_id": iid}))
    record: dict[str, Any] = answer["record"]
    record["events"] = answer["events"]
    return record


def delivery(record: dict[str, Any]) -> list[tuple[str, str]]:
    """The record's delivery events: (kind, channel)."""
    return [
        (e["kind"], e["attrs"].get("channel"))
        for e in record["events"]
        if e["kind"].startswith("RESULT_DELIVER")
    ]


async def _error(mcp: Connected, args: dict[str, Any], code: str) -> dict[str, Any]:
    """Call ``http_request``; its answer must be an error envelope with ``code``, flagged
    isError, rendered in the text, and the journal's record must agree."""
    result = await mcp.call("http_request", args)
    envelope = structured(result)
    assert result.is_error is True, envelope
    error = envelope["error"]
    assert error["code"] == code, envelope
    assert result.content[0].text.startswith(f"error {code}: phase {error['phase']}")
    record = await _record(mcp, envelope["invocation_id"])
    if code != "IN_PROGRESS":
        assert (record["code"], record["outcome"], record["retry"]) == (
            code,
            error["outcome"],
            error["retry"],
        )
    return envelope


async def test_every_tool_answers_through_the_sdk_client(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    cfg = remotes.config(tmp_path)
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        listed = {t.name: t for t in (await mcp.session.list_tools()).tools}
        assert set(listed) == ACTION_TOOLS | READ_TOOLS
        for word in ("outcome", "retry", "reconcile", "never repeat", "fetch_result"):
            assert word in (listed["http_request"].description or "")
        assert "a read" in (listed["fetch_result"].description or "")
        assert listed["get_record"].annotations.read_only_hint is True

        targets = structured(await mcp.call("list_targets"))
        session = targets["session"]
        assert session.startswith("mcp-") and len(session) == 28
        by_name = {t["name"]: t for t in targets["targets"]}
        assert by_name["ok"]["description"] == "answers 200, echoing what it saw"
        assert by_name["pay"]["idempotency"]["scope"] == "payments"
        assert by_name["ok"]["methods"] == ["GET", "POST", "PUT"]
        assert "env:" not in str(targets) and "credential" not in str(targets)

        result = await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/a"})
        envelope = structured(result)
        assert result.is_error is False
        assert envelope["result"]["status"] == 200
        assert result.content[0].text.startswith("ok: outcome committed, status 200")
        iid = envelope["invocation_id"]

        record = await _record(mcp, iid)
        assert (record["outcome"], record["session"]) == ("committed", session)

        # Recorded delivered once the answer's line was written whole to the client: just
        # after the client could read it.
        async def delivered() -> bool:
            return delivery(await _record(mcp, iid)) == [("RESULT_DELIVERED", "deliver")]

        await wait_until(delivered, "the delivery is recorded")

        fetched = await mcp.call("fetch_result", {"invocation_id": iid})
        assert fetched.is_error is False
        assert structured(fetched)["result"] == envelope["result"]

        listed_actions = structured(await mcp.call("list_actions"))
        assert listed_actions["session"] == session
        assert [a["invocation_id"] for a in listed_actions["actions"]] == [iid]

        named = {"target": "ok", "method": "GET", "path": "/b", "session": "my-run"}
        other = structured(await mcp.call("http_request", named))
        assert (await _record(mcp, other["invocation_id"]))["session"] == "my-run"
        mine = structured(await mcp.call("list_actions", {"session": "my-run"}))
        assert [a["invocation_id"] for a in mine["actions"]] == [other["invocation_id"]]

        submitted = structured(
            await mcp.call("http_request", {"target": "jobs", "method": "POST", "path": "/jobs"})
        )
        op = submitted["operation"]
        assert op["state"] == "pending"
        polled = await mcp.call("poll_operation", {"operation_id": op["id"]})
        answer = structured(polled)
        assert polled.is_error is False
        assert answer["operation"]["state"] == "succeeded"
        assert answer["poll"]["result"]["status"] == 200

    # A new connection is a new session.
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        again = structured(await mcp.call("list_targets"))["session"]
        assert again != session
        assert structured(await mcp.call("list_actions"))["actions"] == []
    assert "Traceback" not in (tmp_path / "mcp.log").read_text()


async def test_error_envelopes_arrive_flagged_with_their_structured_content(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    cfg = remotes.config(tmp_path)
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        rejected = await _error(
            mcp, {"target": "rejects", "method": "GET", "path": "/"}, "REMOTE_REJECTED"
        )
        assert rejected["error"]["outcome"] == "rejected"

        dropped = await _error(
            mcp,
            {"target": "drops", "method": "POST", "path": "/", "body": "{}"},
            "REMOTE_OUTCOME_UNKNOWN",
        )
        assert (dropped["error"]["outcome"], dropped["error"]["retry"]) == ("unknown", "reconcile")

        pay = {
            "target": "pay",
            "method": "POST",
            "path": "/p",
            "body": "1",
            "idempotency_key": "k1",
        }
        first = await mcp.call("http_request", pay)
        assert first.is_error is False and "result" in structured(first)
        mismatch = await _error(mcp, {**pay, "body": "2"}, "IDEMPOTENCY_MISMATCH")
        assert mismatch["error"]["field"] == "idempotency_key"

        # A call held by the remote: while it runs, its record reads IN_PROGRESS (fetch_result,
        # retry fetch_result) -- the second reader never sends anything.
        held = {"target": "holds", "method": "POST", "path": "/h", "idempotency_key": "h1"}
        async with trio.open_nursery() as nursery:
            finished: list[Any] = []

            async def first_call() -> None:
                finished.append(await mcp.call("http_request", held))

            nursery.start_soon(first_call)
            await wait_for(remotes.holds.event("received"))
            running = structured(await mcp.call("list_actions", {"outcome": "unknown"}))
            iid = running["actions"][-1]["invocation_id"]
            in_progress = await mcp.call("fetch_result", {"invocation_id": iid})
            envelope = structured(in_progress)
            assert in_progress.is_error is True
            assert (envelope["error"]["code"], envelope["error"]["retry"]) == (
                "IN_PROGRESS",
                "fetch_result",
            )
            remotes.holds.event("release").set()
        assert finished[0].is_error is False
        assert structured(finished[0])["invocation_id"] == iid
    assert len(remotes.holds.requests) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_malformed_arguments_are_validation_envelopes_never_protocol_errors(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    """Either backend: through the daemon the broker is the daemon, and answers the same."""
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("http_request", {"target": "ok", "method": 5, "path": "/"}, "INVALID_FIELD", "method"),
        ("http_request", {"target": "ok", "method": "GET"}, "MISSING_FIELD", "path"),
        (
            "http_request",
            {"target": "nope", "method": "GET", "path": "/"},
            "INVALID_TARGET",
            "target",
        ),
        (
            "http_request",
            {"target": "ok", "method": "GET", "path": "/", "pth": 1},
            "INVALID_FIELD",
            "pth",
        ),
        (
            "http_request",
            {"target": "ok", "method": "GET", "path": "/", "headers": {"Authorization": "x"}},
            "FORBIDDEN_HEADER",
            "headers.Authorization",
        ),
        (
            "http_request",
            {"target": "ok", "method": "GET", "path": "/", "headers": [1]},
            "INVALID_FIELD",
            "headers",
        ),
        (
            "http_request",
            {"target": "ok", "method": "GET", "path": "/", "command": "ls"},
            "UNSUPPORTED_ACTION",
            "command",
        ),
        ("fetch_result", {}, "MISSING_FIELD", "invocation_id"),
        ("fetch_result", {"invocation_id": "act_nope"}, "INVALID_FIELD", "invocation_id"),
        ("fetch_result", {"invocation_id": "x", "from_chunk": -1}, "INVALID_FIELD", "from_chunk"),
        ("get_record", {"invocation_id": ["x"]}, "INVALID_FIELD", "invocation_id"),
        ("list_actions", {"limit": "many"}, "INVALID_FIELD", "limit"),
        ("list_actions", {"outcome": "done"}, "INVALID_FIELD", "outcome"),
        ("list_targets", {"x": 1}, "INVALID_FIELD", "x"),
        ("poll_operation", {"operation_id": "op_nope"}, "INVALID_FIELD", "operation_id"),
        ("no_such_tool", {}, "UNSUPPORTED_ACTION", "name"),
    ]
    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        for tool, args, code, field in cases:
            result = await mcp.call(tool, args)
            answer = structured(result)
            assert result.is_error is True, (tool, args, answer)
            assert (answer["error"]["code"], answer["error"]["field"]) == (code, field), answer
            assert answer["error"]["phase"] == "validation"
            assert answer["error"]["outcome"] == "not_attempted"
            if tool == "http_request" and code != "INVALID_TARGET":
                # An action is journaled like any other: refused before anything was sent.
                record = await _record(mcp, answer["invocation_id"])
                assert (record["code"], record["field"]) == (code, field)
        # An unknown tool's name is quoted back only when short and plain.
        for name in ("x" * 100_000, "ev\u202eil", "a\nb"):
            answer = structured(await mcp.call(name, {}))
            assert answer["error"]["code"] == "UNSUPPORTED_ACTION", answer
            assert answer["error"]["message"] == "no tool by that name (tools/list)", answer
    assert not remotes.ok.requests
    assert "Traceback" not in (tmp_path / "mcp.log").read_text()


async def test_a_message_larger_than_any_action_is_dropped_unread_and_the_session_goes_on(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """The bound ``affidavit call`` and the daemon apply to an action's JSON (issue 9's
    ``action_size_limit``: every target here takes at most 1 MiB) bounds a message too: the
    server reads past it without holding it, answers it with an id-null error, and answers the
    next one."""
    from mcp.shared.exceptions import MCPError

    cfg = remotes.config(tmp_path)
    huge = {"target": "ok", "method": "POST", "path": "/", "body": "x" * (8 << 20)}
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        with pytest.raises(MCPError):
            await mcp.session.call_tool("http_request", huge, read_timeout_seconds=3)
        after = await mcp.call("http_request", {"target": "ok", "method": "GET", "path": "/"})
        assert after.is_error is False
    # Answered, though its id was never read: the SDK client cannot match an id-null error.
    answers = [m for m in wire_json(mcp) if m.get("id", 0) is None]
    assert [a["error"]["code"] for a in answers] == [-32600], answers
    assert "dropped unread" in mcp.stderr()
    assert len(remotes.ok.requests) == 1


async def test_a_removed_binding_answers_the_journals_words_not_an_outage(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """A same-key call whose binding someone deleted from the journal file is refused as the
    daemon refuses it (``call_failure``): JOURNAL_UNREADABLE with the seq that names the key,
    not JOURNAL_UNAVAILABLE (an outage a retry would meet again) -- and nothing is sent."""
    cfg = remotes.config(tmp_path)
    pay = {"target": "pay", "method": "POST", "path": "/p", "body": "1", "idempotency_key": "k9"}
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        first = await mcp.call("http_request", pay)
        assert first.is_error is False and "result" in structured(first)
        sent = len(remotes.ok.requests)
        conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
        try:
            conn.execute("DELETE FROM idempotency WHERE key = 'k9'")
        finally:
            conn.close()
        again = await mcp.call("http_request", pay)
        answer = structured(again)
        assert again.is_error is True
        problem = answer["api_error"]
        assert problem["code"] == "JOURNAL_UNREADABLE", answer
        assert "has no binding row, but the ACTION_ACCEPTED at seq" in problem["message"]
        assert "k9" not in problem["message"]
        # No record proves where the call stopped: it may have run, never resent blindly.
        assert (problem["outcome"], problem["retry"]) == ("unknown", "reconcile"), problem
        assert len(remotes.ok.requests) == sent


async def test_an_action_s_session_with_a_space_lists_its_actions(
    tmp_path: Path, remotes: Remotes, token: str
) -> None:
    """A session an action may name (printable ASCII, the space too) is one ``list_actions``
    takes: its published schema is the action tools' ``session`` schema (one definition), and
    an agent lists its own ``"run 1"`` session's actions.  It used to refuse the space."""
    cfg = remotes.config(tmp_path)
    async with connected(["--config", str(cfg)], remotes.env(token), tmp_path / "mcp.log") as mcp:
        tools = {t.name: t.input_schema for t in (await mcp.session.list_tools()).tools}
        listed = tools["list_actions"]["properties"]["session"]
        named = tools["http_request"]["properties"]["session"]
        assert (listed["pattern"], listed["maxLength"]) == (named["pattern"], named["maxLength"])
        action = {"target": "ok", "method": "GET", "path": "/a", "session": "run 1"}
        iid = structured(await mcp.call("http_request", action))["invocation_id"]
        result = await mcp.call("list_actions", {"session": "run 1"})
        assert result.is_error is False, structured(result)
        assert [a["invocation_id"] for a in structured(result)["actions"]] == [iid]
        refused = structured(await mcp.call("list_actions", {"session": "run\t1"}))
        assert refused["error"]["field"] == "session", refused
