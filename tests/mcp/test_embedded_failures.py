"""Embedded, a call, a poll or a query that ended without an answer says what its code path
proves: a poll or a query that failed inside the broker (INTERNAL) is asked again
(``backoff``, as docs/mcp.md says -- it never repeats the call), a call's is never resent
blindly (``reconcile``); a call the journal ended before the engine named an invocation was
never dispatched (``not_attempted``) -- unless an earlier call under its idempotency_key
may have run --, one it ended after may have run (``unknown``).

The broker's method is replaced by one that fails as the engine would (a bug: RuntimeError; the
journal's: JournalReplaced, with or without the invocation named to the call's control)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.engine import call_failure
from affidavit.journal import JournalError, JournalReplaced, JournalWriteError, ReadFailed
from affidavit.mcp.backends import Embedded, Exchange
from tests.broker.helpers import TOKEN_ENV

from .conftest import Remotes
from .kit import WAIT


async def bug(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in the broker")


@pytest.mark.parametrize("tool", ["poll_operation", "reconcile_query"])
async def test_a_poll_or_query_that_failed_inside_the_broker_is_asked_again(
    tmp_path: Path, remotes: Remotes, token: str, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    monkeypatch.setenv(TOKEN_ENV, token)
    with trio.fail_after(WAIT):
        async with Embedded.open(str(remotes.config(tmp_path))) as backend:
            monkeypatch.setattr(backend.broker, "poll_operation", bug)
            monkeypatch.setattr(backend.broker, "reconcile", bug)
            answer = await getattr(backend, tool)("op_or_act_1")
    error = answer["api_error"]
    assert (error["code"], error["outcome"], error["retry"]) == ("INTERNAL", "unknown", "backoff")


KEYED = "this request sent nothing; an earlier call under its idempotency_key may have run"


@pytest.mark.parametrize(
    ("named", "key", "outcome", "words"),
    [
        (None, None, "not_attempted", "before the call was accepted: nothing was sent"),
        ("act_1", None, "unknown", "act_1: whether it was sent is recorded"),
        # An earlier call under the key may have run (tests/mcp/test_tools.py's removed binding):
        # its message says so too (it said "nothing was sent").
        (None, "k1", "unknown", f"before the call was accepted: {KEYED}"),
    ],
)
async def test_a_call_the_journal_ended_is_unknown_only_once_the_engine_named_it(
    tmp_path: Path,
    remotes: Remotes,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    named: str | None,
    key: str | None,
    outcome: str,
    words: str,
) -> None:
    async def replaced(action: Any, *, deliver: Any, control: Any) -> Any:
        control.invocation_id = named  # the engine names it before any dispatch
        raise JournalReplaced("the journal's file was replaced")

    monkeypatch.setenv(TOKEN_ENV, token)
    with trio.fail_after(WAIT):
        async with Embedded.open(str(remotes.config(tmp_path))) as backend:
            monkeypatch.setattr(backend.broker, "call", replaced)
            action = {"target": "ok", "method": "GET", "path": "/", "idempotency_key": key}
            answer = await backend.call(action, Exchange())
    error = answer["api_error"]
    assert (error["code"], error["outcome"]) == ("JOURNAL_REPLACED", outcome), error
    assert words in error["message"], error
    assert ("nothing was sent" in error["message"]) is (named is None and key is None), error
    assert not remotes.ok.requests


@pytest.mark.parametrize(
    "exc",
    [JournalReplaced("replaced"), ReadFailed("a statement timeout"), JournalError("away")],
    ids=["replaced", "read_declined", "unavailable"],
)
def test_a_keyed_call_the_journal_ended_unnamed_never_says_nothing_was_sent(
    exc: Exception,
) -> None:
    """Each of ``call_failure``'s words for a call ended before it named an invocation: a keyed
    one says what this request sent, and that an earlier one under its key may have run."""
    assert "nothing was sent" in call_failure(exc, None)[2]
    keyed = call_failure(exc, None, keyed=True)[2]
    assert KEYED in keyed and "nothing was sent" not in keyed, keyed


@pytest.mark.parametrize(
    ("tool", "asked", "read"),
    [
        ("poll_operation", "op_01J00000000000000000000000", "act_01J00000000000000000000000"),
        ("reconcile_query", "act_01J00000000000000000000000", "act_01J00000000000000000000000"),
    ],
)
async def test_a_poll_or_query_the_journal_did_not_take_names_the_tool_that_tells(
    tmp_path: Path,
    remotes: Remotes,
    token: str,
    monkeypatch: pytest.MonkeyPatch,
    tool: str,
    asked: str,
    read: str,
) -> None:
    """Its write lost (JOURNAL_UNAVAILABLE): what tells whether it was recorded, once the
    journal is back, is the agent's own get_record (of the submission, whose record holds its
    polls) -- never a command line the agent does not have (``affidavit record``)."""

    async def lost(*args: Any, **kwargs: Any) -> Any:
        raise JournalWriteError("the write was lost")

    monkeypatch.setenv(TOKEN_ENV, token)
    with trio.fail_after(WAIT):
        async with Embedded.open(str(remotes.config(tmp_path))) as backend:
            monkeypatch.setattr(backend.broker, "poll_operation", lost)
            monkeypatch.setattr(backend.broker, "reconcile", lost)
            answer = await getattr(backend, tool)(asked)
    error = answer["api_error"]
    assert (error["code"], error["outcome"]) == ("JOURNAL_UNAVAILABLE", "unknown"), error
    assert f"the get_record tool (invocation_id {read})" in error["message"], error
    assert "affidavit " not in error["message"], error
