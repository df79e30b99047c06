"""``poll_operation`` of an operation there is none of answers alike embedded and through the
daemon: ``INVALID_FIELD`` at ``operation_id``, the id echoed as sent -- even when it is the
journal's own path, which an answer that put ``the journal`` in its place would confirm
(``engine.unplaced`` changes only the journal's own words; the daemon's 422 ``OPERATION_ERROR``
names the id asked for, nothing of the journal's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.text import echoed
from tests.mcp.kit import structured

from .conftest import Remotes
from .test_modes import MODES, session


@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_operation_is_the_same_refusal_in_both_modes_and_no_oracle(
    tmp_path: Path, remotes: Remotes, token: str, mode: str
) -> None:
    async with session(mode, tmp_path, remotes, token) as (mcp, _):
        journal = tmp_path / "journal.db"
        assert journal.is_file()
        for guess in ("op_nope", str(journal), str(journal) + "x"):
            answer = structured(await mcp.call("poll_operation", {"operation_id": guess}))
            assert answer == {
                "error": {
                    "code": "INVALID_FIELD",
                    "phase": "validation",
                    "outcome": "not_attempted",
                    "retry": "after_correction",
                    "message": f"no operation {echoed(guess)} in the journal",
                    "field": "operation_id",
                }
            }, (mode, answer)
