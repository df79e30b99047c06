"""Batches against a hostile remote (audit 48b, #1-#3): an item's outcome and hint stand only on
what a complete, authentic answer says of *that* item, and never above the parent's.

Seed: "Retry only the item for which the records and the remote contract permit it."  An item
matched to another's result, picked from two results that disagree, or given a success by the
body of a 401 would invite a corrected resend of an applied item -- or forbid resending one
nobody applied.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from affidavit.adapters.base import RemoteResult
from affidavit.protocols.http.batch import read_items
from affidavit.protocols.http.selectors import parse_selector
from affidavit.statemachine import Code, EventKind, Outcome
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_error, event_kinds, http_target, open_broker, write_config
from .http_rows import LIMIT
from .test_batches import BATCH, _outcomes, _run

E = EventKind
UNKNOWN = ("unknown", "REMOTE_RESULT_INCOMPLETE", "reconcile")
REFUSED = ("rejected", "REMOTE_REJECTED")
THROTTLED = ("rejected", "REMOTE_THROTTLED")


def _call(body: str) -> dict[str, Any]:
    return {"target": "bulk", "method": "POST", "path": "/batch", "body": body}


def _b64(body: bytes) -> dict[str, Any]:
    call = _call("")
    del call["body"]
    return {**call, "body_base64": base64.b64encode(body).decode()}


def _items(*ids: Any) -> dict[str, Any]:
    return _call(json.dumps({"items": [{"op": "set"} if i is None else {"id": i} for i in ids]}))


def _answer(status: int, *results: tuple[Any, Any]) -> Reply:
    body = {"results": [{"id": i, "status": s} for i, s in results]}
    return Reply(status, body=json.dumps(body).encode())


# --- #1: with item_id, every item sent carries a distinct id, or nothing is sent --------------


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (_items(1, None), "body.items[1].id", "needs an id"),
        (_items(1, 1), "body.items[1].id", "repeats the id of item 0"),
        (_items(7, "7"), "body.items[1].id", "repeats the id of item 0"),  # one id either way
        (_items(1, True), "body.items[1].id", "needs an id"),
        (_items(1, "x" * 257), "body.items[1].id", "needs an id"),
        (_call('{"items": [{"id": 1}], "items": [{"id": 2}, {"id": 3}]}'), "body.items", "twice"),
        (_call('{"items": [{"id": 1, "id": 2}]}'), "body.items[0].id", "twice"),
        (_call('{"items": [{"id": 1, "n": NaN}]}'), "body", "NaN"),
        (_call('{"items": [{"id": 1, "n": Infinity}]}'), "body", "holds Infinity"),
        (_call('{"items": [{"id": 1, "n": -Infinity}]}'), "body", "-Infinity"),
        (_call('{"items": [{"id": 1, "n": 1e400}]}'), "body", "beyond a double's range"),
        # JSON other readers read, Python's does not: read as no JSON, sent as no batch before.
        (_call('{"items": [{"id": 1, "v": %s}, {"op": "noid"}]}' % ("9" * 5000)), "body", "4300"),
        (_b64(b'{"items": [{"id": 1, "v": "\xff"}, {"op": "noid"}]}'), "body_base64", "not text"),
        (_call('{"items": [{"id": 1, "v": %s}]}' % ("[" * 5000 + "]" * 5000)), "body", "deep"),
        # The path names the field the caller sent.
        (
            _b64(json.dumps({"items": [{"id": 1}, {"op": 2}]}).encode()),
            "body_base64.items[1].id",
            "id",
        ),
        (_b64(b'{"items": [{"id": 1, "id": 2}]}'), "body_base64.items[0].id", "twice"),
    ],
    ids=[
        "missing",
        "repeated",
        "int-and-text",
        "boolean",
        "too-long",
        "dup-list",
        "dup-id",
        "nan",
        "infinity",
        "minus-infinity",
        "1e400",
        "5000-digits",
        "invalid-utf8",
        "nests-too-deep",
        "base64-missing",
        "base64-dup-id",
    ],
)
async def test_a_batch_whose_items_cannot_be_told_apart_is_refused_before_dispatch(
    tmp_path: Path, token: str, call: dict[str, Any], field: str, words: str
) -> None:
    # Results are matched to items by id; an item without one (or sharing one) was matched by
    # position before, while the response listed them by id in another order: the item applied
    # was recorded rejected / after_correction, and a corrected resend applied it twice.
    async with HostileServer.running(scripts.serve(_answer(207, (1, 200)))) as srv:
        cfg = write_config(tmp_path, {"bulk": http_target(srv.url, batch=BATCH)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(call)
            rec = assert_error(
                broker,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="INVALID_FIELD",
            )
            kinds = event_kinds(broker, env["invocation_id"])
    assert (env["error"]["field"], rec.field) == (field, field)
    assert words in env["error"]["message"]
    assert E.DISPATCH_STARTED not in kinds and srv.requests == []


async def test_without_item_id_items_are_matched_by_position_only_when_every_one_is_answered(
    tmp_path: Path, token: str
) -> None:
    # No ids: the i-th result is the i-th item's -- when the list answers every item.  Four
    # results for five items: which one was left out is not said, so none is matched.
    by_position = {"item_id": None}
    five = Reply(
        207,
        body=json.dumps({"results": [{"status": s} for s in (200, 409, 200, 200, 500)]}).encode(),
    )
    env, _k, _m = await _run(tmp_path / "five", scripts.serve(five), by_position)
    assert [(i["id"], i["outcome"]) for i in env["items"]] == [
        (0, "committed"),
        (1, "rejected"),
        (2, "committed"),
        (3, "committed"),
        (4, "committed"),
    ]
    four = Reply(
        207, body=json.dumps({"results": [{"status": 200}] * 3 + [{"status": 409}]}).encode()
    )
    env, kinds, _m = await _run(tmp_path / "four", scripts.serve(four), by_position)
    assert _outcomes(env) == [(n, *UNKNOWN) for n in range(5)]
    assert E.BATCH_ITEMS_RECORDED in kinds  # as recorded (``_run`` compares them)


# --- #2: an item the response names twice, differently, is not known -------------------------


@pytest.mark.parametrize(
    ("first", "then", "item_1"),
    [
        (400, 200, UNKNOWN),
        (200, 500, UNKNOWN),
        (200, 200, ("committed", None, "never")),  # said twice, the same: said
    ],
    ids=["rejected-then-applied", "applied-then-error", "the-same-twice"],
)
async def test_an_item_answered_twice_differently_is_unknown(
    tmp_path: Path, token: str, first: int, then: int, item_1: tuple[Any, ...]
) -> None:
    results = [(1, first), (1, then), (2, 200), (3, 409), (4, 200), (5, 200)]
    env, kinds, _m = await _run(tmp_path, scripts.serve(_answer(207, *results)))
    assert _outcomes(env) == [
        (1, *item_1),
        (2, "committed", None, "never"),
        (3, "rejected", "REMOTE_REJECTED", "after_correction"),
        (4, "committed", None, "never"),
        (5, "committed", None, "never"),
    ]
    assert E.BATCH_ITEMS_RECORDED in kinds


async def test_a_batch_response_holding_a_field_twice_classifies_no_item(
    tmp_path: Path, token: str
) -> None:
    # {"status": 200, "status": 400}: Python's parser keeps the last, another reader the
    # first.  The body says nothing anyone can vouch for: every item unknown, the parent a
    # complete 207 all the same.
    body = (
        b'{"results": ['
        + b",".join(b'{"id": %d, "status": 200, "status": 400}' % n for n in range(1, 6))
        + b"]}"
    )
    env, kinds, _m = await _run(tmp_path, scripts.serve(Reply(207, body=body)))
    assert "error" not in env and env["result"]["status"] == 207
    assert _outcomes(env) == [(n, *UNKNOWN) for n in range(1, 6)]
    assert E.BATCH_ITEMS_RECORDED in kinds


# --- #3: items never say more than the parent --------------------------------------------------


@pytest.mark.parametrize(
    ("status", "items", "parent", "each"),
    [
        # A refusal, a 401 too, may stand beside applied items its body lists (non-atomic): an
        # item listed applied is unknown -- "rejected" would invite a resend applying it twice
        # -- one listed refused keeps the parent's rejection, one the list leaves out is not
        # said (the list does not speak for it, and the parent does not speak beside a list).
        (401, (201, 401), ("rejected", "REMOTE_REJECTED"), [UNKNOWN[:2], REFUSED]),
        (400, (201, 422), ("rejected", "REMOTE_REJECTED"), [UNKNOWN[:2], REFUSED]),
        (400, (201, None), ("rejected", "REMOTE_REJECTED"), [UNKNOWN[:2]] * 2),
        (503, (201, 422), ("rejected", "REMOTE_THROTTLED"), [UNKNOWN[:2], THROTTLED]),
        (429, (200, 429), ("rejected", "REMOTE_THROTTLED"), [UNKNOWN[:2], THROTTLED]),
        # A server error may have applied any item: "rejected" would invite a resend.
        (500, (400, 400), ("committed", "REMOTE_ERROR"), [UNKNOWN[:2]] * 2),
        # A redirect (not followed) is no answer about the items at all.
        (303, (200, 200), ("committed", "REMOTE_REDIRECTED"), [UNKNOWN[:2]] * 2),
    ],
    ids=[
        "401-lists-one-applied",
        "400-mixed",
        "400-one-unlisted",
        "503-mixed",
        "429-mixed",
        "500-lists-rejected",
        "303-lists-applied",
    ],
)
async def test_items_listed_under_a_parent_that_is_no_success_take_the_parents_word(
    tmp_path: Path, token: str, status: int, items: tuple[Any, Any], parent: Any, each: Any
) -> None:
    # Items 1 and 2 as listed (None: not listed), items 3-5 refused.
    listed = [(n, s) for n, s in zip((1, 2), items, strict=True) if s is not None]
    refused = 429 if status in (429, 503) else 422
    reply = _answer(status, *listed, *((n, refused) for n in range(3, 6)))
    env, kinds, _m = await _run(tmp_path, scripts.serve(reply))
    assert (env["error"]["outcome"], env["error"]["code"]) == parent
    rest = UNKNOWN[:2] if status in (500, 303) else parent  # items 3-5: listed refused
    assert [(i["outcome"], i["code"]) for i in env["items"]] == [*each, rest, rest, rest]
    assert not any("status" in i for i in env["items"])  # no item's own status was taken
    assert E.BATCH_ITEMS_RECORDED in kinds
    # Seed: "a single retry hint cannot safely be assigned to the whole batch" -- beside an
    # item the parent does not refuse, following its after_correction resends that item too.
    assert env["error"]["retry"] == "reconcile"


def _target() -> Any:
    """A target whose ``batch`` is ``BATCH`` (``read_items`` reads nothing else of it)."""

    def sel(text: str) -> Any:
        return parse_selector(text, ("json",))

    contract = SimpleNamespace(
        items=sel("json:/results"),
        request_items=sel("json:/items"),
        item_id=sel("json:/id"),
        item_status=sel("json:/status"),
        ok=(200, 201),
        rejected=(),
        atomic=False,
    )
    return SimpleNamespace(batch=contract)


@pytest.mark.parametrize(
    "body",
    [None, b'{"results": [{"id": 1, "status": 422, "status": 201}]}'],
    ids=["not-read-whole", "field-twice"],
)
def test_a_rejection_whose_body_was_not_read_refuses_no_item_for_it(body: bytes | None) -> None:
    # A 400's body not kept whole, or read otherwise by another reader, may list item 1 applied.
    action = SimpleNamespace(batch=((1, 2), True))  # items 1 and 2 sent
    refused = RemoteResult(Outcome.REJECTED, Code.REMOTE_REJECTED, facts={"status": 400})
    items = read_items(action, _target(), refused, body)
    assert items is not None
    assert [(i["outcome"], i["code"], i["retry"]) for i in items] == [UNKNOWN] * 2
    read = read_items(
        action,
        _target(),
        refused,
        b'{"results": [{"id": 1, "status": 422}, {"id": 2, "status": 400}]}',
    )
    assert read is not None and {i["outcome"] for i in read} == {"rejected"}  # read: refused


U, R = UNKNOWN, ("rejected", "REMOTE_REJECTED", "after_correction")


@pytest.mark.parametrize(
    ("by_id", "body", "each"),
    [
        # No item list at all: the whole request was refused, each item with it.
        (True, b"", [R, R]),
        (True, b"<html>Bad Request</html>", [R, R]),
        (True, b'{"error": "bad"}', [R, R]),
        (True, b'{"results": {"id": 1, "status": 201}}', [R, R]),  # another shape: no list
        # A list: the parent speaks only for the items it lists refused.
        (True, b'{"results": [{"id": 1, "status": 422}, {"id": 2, "status": 409}]}', [R, R]),
        (True, b'{"results": [{"id": 1, "status": 201}]}', [U, U]),  # 2 left out
        (True, b'{"results": [{"id": 1, "status": 422}]}', [R, U]),  # 2 left out
        (True, b'{"results": []}', [U, U]),
        (True, b'{"results": [{"id": 1, "created": true}, {"id": 2, "status": 422}]}', [U, R]),
        (True, b'{"results": [{"id": 1, "status": 201.0}, {"id": 2, "status": 422}]}', [U, R]),
        (True, b'{"results": [{"id": 1, "status": {"c": 422}}, {"id": 2, "status": 422}]}', [U, R]),
        (True, b'{"results": [{"id": 1.0, "status": 422}, {"id": 2, "status": 422}]}', [U, R]),
        # By position: only a list answering every item sent names any.
        (False, b'{"results": [{"status": 201}]}', [U, U]),
        (False, b'{"results": [{"status": 422}]}', [U, U]),
        (False, b'{"results": [{"status": 422}, {"status": 422}, {"status": 201}]}', [U, U]),
        (False, b'{"results": [{"status": 201}, {"status": 422}]}', [U, R]),
        # Unreadable: it may list any item applied.
        (True, b'{"results": [{"id": 1, "status": 422, "n": "\xff"}]}', [U, U]),
        (True, b'{"results": [{"id": 1, "status": 422, "n": 1e400}]}', [U, U]),
        (True, b'{"results": [{"id": 1, "status": 422, "n": %s}]}' % (b"9" * 5000), [U, U]),
    ],
    ids=[
        "empty",
        "html",
        "no-list",
        "list-is-an-object",
        "all-listed-refused",
        "one-applied-one-unlisted",
        "one-refused-one-unlisted",
        "empty-list",
        "listed-without-status",
        "status-201.0",
        "status-an-object",
        "id-1.0-matches-nothing",
        "positional-short-applied",
        "positional-short-refused",
        "positional-long",
        "positional-whole",
        "invalid-utf8",
        "1e400",
        "5000-digits",
    ],
)
@pytest.mark.parametrize("status", [400, 401])
def test_a_rejection_speaks_for_an_item_only_without_a_list_or_listing_it_refused(
    by_id: bool, body: bytes, each: list[tuple[Any, ...]], status: int
) -> None:
    target = _target()
    if not by_id:
        target.batch.item_id = None
    action = SimpleNamespace(batch=((1, 2), True) if by_id else ((0, 1), False))
    parent = RemoteResult(Outcome.REJECTED, Code.REMOTE_REJECTED, facts={"status": status})
    items = read_items(action, target, parent, body)
    assert items is not None
    assert [(i["outcome"], i["code"], i["retry"]) for i in items] == each


async def test_a_rejection_refusing_every_item_keeps_its_hint(tmp_path: Path, token: str) -> None:
    # The other side of the rule above: every item refused, the parent's hint stands.
    reply = _answer(400, *((n, 422) for n in range(1, 6)))
    env, _kinds, _m = await _run(tmp_path, scripts.serve(reply))
    assert [i["outcome"] for i in env["items"]] == ["rejected"] * 5
    assert env["error"]["retry"] == "after_correction"


async def test_a_call_bound_before_its_body_was_refused_is_answered_by_its_key(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sent before the strict reading (a NaN in an item): the same call again with its key -- an
    # SDK retrying on same_idempotency_key -- gets the stored invocation, not INVALID_FIELD;
    # another body under the key is refused as before, and binds nothing.
    from affidavit.protocols.http import action as http_action

    idem = {"header": "Idempotency-Key", "scope": "bulk.items", "retention": "24h"}
    call = {**_call('{"items": [{"id": 1, "n": NaN}]}'), "idempotency_key": "k-1"}
    reply = _answer(207, (1, 200))
    async with HostileServer.running(scripts.serve(reply)) as srv:
        target = http_target(srv.url, batch=BATCH, idempotency=idem)
        async with open_broker(write_config(tmp_path, {"bulk": target})) as broker:
            with monkeypatch.context() as before:
                before.setattr(http_action, "items_sent", lambda *_a: ((1,), True))
                with trio.fail_after(LIMIT):
                    first = await broker.call(call)
            assert "error" not in first, first
            with trio.fail_after(LIMIT):
                again = await broker.call(call)
                other = await broker.call({**call, "body": '{"items": [{"id": 2, "n": NaN}]}'})
            assert again["invocation_id"] == first["invocation_id"]
            assert again["result"]["status"] == 207
            assert (other["error"]["code"], other["error"]["field"]) == ("INVALID_FIELD", "body")
            assert other["invocation_id"] != first["invocation_id"]
