"""What a warm call costs the trio loop in Python frames of the broker's own, pinned where issue 15
(c=1) cut them -- counted with ``sys.setprofile``, never timed -- and the behaviour those cuts keep.

* No ABC ``__instancecheck__`` from the broker's code: a dict action, a dict lease, a plain TCP
  stream are told by their exact type (a ``Mapping`` that is no dict still is one).
* The journal writer's hand-off at each I/O wait is ``Writer._hand_off_idle`` called by trio
  itself, not through a method of the instrument.
* The recorder looks its call's task up once per write and once when the call is done.
"""

from __future__ import annotations

import sys
from collections import Counter, UserDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType, MappingProxyType
from typing import Any

import pytest
import trio

from affidavit.protocols.actions import ActionInvalid, accepted_session, check_shape, parse_action
from affidavit.statemachine.withheld import caller_evidence
from tests.http.hostile import HostileServer, Reply, scripts

from .helpers import assert_ok, event_kinds, http_target, open_broker, write_config
from .test_actions import make_config

LIMIT = 10
GET = {"target": "api", "method": "GET", "path": "/thing"}
ROOT = str(Path(__file__).resolve().parents[2])
PACKAGES = tuple(f"{ROOT}/{part}/" for part in ("affidavit", "adapters", "journal", "statemachine"))
"""The broker's own code: a virtualenv inside the checkout (``.venv/``, trio's and h11's files
under ``ROOT``) is a library's."""


def _ours(frame: FrameType | None) -> str | None:
    """``file:function`` of a frame of this repository's code (None: a library's, or none)."""
    if frame is None:
        return None
    path = frame.f_code.co_filename
    if not path.startswith(PACKAGES):
        return None
    return f"{path[len(ROOT) + 1 :]}:{frame.f_code.co_name}"


@contextmanager
def counted(names: set[str]) -> Iterator[Counter[tuple[str, str | None]]]:
    """Python calls of functions named ``names`` on this thread, by (name, the caller if it is
    the broker's own code)."""
    seen: Counter[tuple[str, str | None]] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in names:
            seen[(frame.f_code.co_name, _ours(frame.f_back))] += 1

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


async def _warm_call(tmp_path: Path, names: set[str]) -> Counter[tuple[str, str | None]]:
    async with HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                await broker.call(GET)  # warm: the connection is pooled
                with counted(names) as seen:
                    env = await broker.call(GET)
                await broker.settled()  # its delivery, queued (for the sync reads below)
            assert_ok(broker, env)
            assert len(event_kinds(broker, env["invocation_id"])) == 10
    return seen


async def test_a_warm_call_makes_no_abc_instance_check_of_its_own(
    tmp_path: Path, token: str
) -> None:
    seen = await _warm_call(tmp_path, {"__instancecheck__"})
    ours = {caller: n for (_, caller), n in seen.items() if caller is not None}
    assert ours == {}


async def test_the_writer_hand_off_at_each_io_wait_is_called_by_trio_itself(
    tmp_path: Path, token: str
) -> None:
    seen = await _warm_call(tmp_path, {"before_io_wait", "_hand_off_idle"})
    assert seen[("_hand_off_idle", None)] > 0  # trio's instrument call, at each I/O wait
    assert not any(name == "before_io_wait" for name, _ in seen)  # no frame in between


async def test_the_recorder_looks_its_task_up_once_per_write(tmp_path: Path, token: str) -> None:
    seen = await _warm_call(tmp_path, {"current_task"})
    by_recorder = {
        caller: n
        for (_, caller), n in seen.items()
        if caller is not None and caller.startswith("affidavit/engine/recorder.py")
    }
    # Two write_many (the preamble with CREDENTIAL_AUTHORIZED; the response events), one settle
    # (RESULT_COMMITTED's record), the call's end, and the attempt the call takes (``attempting``:
    # what closes a call's attempt from inside closes only its own).  The RESULT_DELIVERED queued
    # after the hand-over (``deliver_later``) looks no task up: it is the engine's, kept by
    # invocation.  The dispatch gate's DISPATCH_STARTED presupposes the call's unsettled posts
    # (``unsettled``: ``Journal.append``'s ``after``, one lookup).
    assert by_recorder == {
        "affidavit/engine/recorder.py:attempting": 1,
        "affidavit/engine/recorder.py:unsettled": 1,
        "affidavit/engine/recorder.py:write_many": 2,
        "affidavit/engine/recorder.py:settle": 1,
        "affidavit/engine/recorder.py:done": 1,
    }


# -- what the exact-type checks keep: any Mapping is still one ---------------------------------

ACTION = {"target": "billing", "method": "GET", "path": "/invoices", "session": "s-1"}


@pytest.mark.parametrize("wrap", [dict, MappingProxyType, UserDict])
def test_an_action_that_is_a_mapping_but_no_dict_parses_as_the_dict_does(wrap: Any) -> None:
    config = make_config()
    assert parse_action(wrap(ACTION), config) == parse_action(dict(ACTION), config)
    assert accepted_session(wrap(ACTION)) == ("s-1", None)


@pytest.mark.parametrize("wrap", [dict, MappingProxyType, UserDict])
def test_a_nested_mapping_that_is_no_dict_is_walked_and_bounded(wrap: Any) -> None:
    value: Any = "leaf"
    for _ in range(100):
        value = wrap({"k": value})
    with pytest.raises(ActionInvalid) as refused:
        check_shape(value)
    assert "nests deeper" in refused.value.message
    check_shape(wrap({"k": wrap({"k": ["a", ("b",)]})}))  # shallow: accepted


@pytest.mark.parametrize("wrap", [dict, MappingProxyType])
def test_a_lease_holder_is_tagged_whatever_mapping_holds_it(wrap: Any) -> None:
    evidence = {"lease": wrap({"holder": "host:1:ab", "generation": 0})}
    shown = caller_evidence("inv_1", evidence, lambda iid, holder: f"tag:{iid}")
    assert shown["lease"] == {"holder": "tag:inv_1", "generation": 0}
    assert caller_evidence("inv_1", {"lease": None}, None) == {"lease": None}
