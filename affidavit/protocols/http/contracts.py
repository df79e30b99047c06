"""HTTP's ``ResultContracts``: asynchronous jobs (``operations.py``) and batches
(``batch.py``), read from a target's ``operations`` and ``batch`` settings."""

from __future__ import annotations

from typing import Any

from affidavit.adapters.base import RemoteResult
from affidavit.protocols.spec import Reading, ResultContracts

from .batch import read_items, sent_items
from .operations import min_poll_interval, poll_action, poll_state, read_operation
from .target import HttpTarget

__all__ = ["HTTP_CONTRACTS"]


def _read(action: Any, target: HttpTarget, result: RemoteResult, body: bytes | None) -> Reading:
    return Reading(
        operation=read_operation(action, target, result, body),
        items=read_items(action, target, result, body),
    )


HTTP_CONTRACTS = ResultContracts(
    batch=sent_items,
    read=_read,
    poll=poll_action,
    poll_state=poll_state,
    min_poll_interval=min_poll_interval,
)
