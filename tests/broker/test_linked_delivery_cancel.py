"""A cancel landing on the record read after a linked call's answer was written -- a shutdown
cancelling the handler while that read waits (here: a shared journal's connection lost once,
``Recorder.read`` waiting to reconnect) -- does not lose the row that says what happened to
the answer (seed: "Mark RESULT_DELIVERED only after the protocol has confirmed complete
transfer"; a failed one is RESULT_DELIVERY_FAILED, the result stays fetchable).  The answer
written whole: RESULT_DELIVERED; cut: RESULT_DELIVERY_FAILED -- each read and row shielded
(``deliver_linked``).  Without the shields the cancel stops the read and nothing is recorded:
the journal would keep saying the poll's result never reached anyone, or never failed to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.journal import JournalUnavailable
from tests.http.hostile import HostileServer, scripts

from .helpers import http_target, open_broker, write_config
from .http_rows import LIMIT
from .test_operations import JOBS, SUBMIT, job_api


@pytest.mark.parametrize(
    ("written", "recorded"),
    [(True, "RESULT_DELIVERED"), (False, "RESULT_DELIVERY_FAILED")],
    ids=["written-whole", "cut"],
)
async def test_a_cancel_at_the_read_after_a_poll_s_answer_loses_no_row(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch, written: bool, recorded: str
) -> None:
    async with HostileServer.running(scripts.serve(job_api(["done"]))) as srv:
        cfg = write_config(tmp_path, {"jobs": http_target(srv.url + "/v1", **JOBS)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                op_id = (await broker.call(SUBMIT))["operation"]["id"]
            journal = broker.journal
            real_record = journal.record
            armed: list[str] = []  # the poll whose next read finds the journal away, once
            met: list[str] = []

            def record(iid: str, *args: Any, **kwargs: Any) -> Any:
                if armed and iid == armed[0]:
                    met.append(armed.pop())
                    raise JournalUnavailable("the journal is away")
                return real_record(iid, *args, **kwargs)

            monkeypatch.setattr(journal, "record", record)
            # As a shared journal's: a read that finds it away waits to reconnect (a checkpoint).
            monkeypatch.setattr(journal.backend, "reconnect_within", LIMIT)
            with trio.CancelScope() as handler:  # the daemon's handler, which shutdown cancels

                async def deliver(answer: dict[str, Any]) -> None:
                    armed.append(answer["poll"]["invocation_id"])
                    handler.cancel()  # arriving while the answer is written
                    if not written:
                        raise ConnectionError("the caller hung up")

                with trio.fail_after(LIMIT):
                    await broker.poll_operation(op_id, deliver=deliver)
            monkeypatch.undo()
            assert len(met) == 1  # the read after the write met the journal away
            await broker.settled()
            rows = [e.kind.value for e in broker.events(met[0])]
            assert [k for k in rows if k.startswith("RESULT_DELIVER")] == [recorded]
