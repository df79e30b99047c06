"""The engine: runs one invocation through the lifecycle, journaling every transition.

``engine.py`` is the front door (``Engine.call``, ``Engine.fetch_result``); its docstring lists
the parts in the order a call meets them."""

from affidavit.engine.collector import tune_collector
from affidavit.engine.control import CallControl
from affidavit.engine.delivery import NotAnswered
from affidavit.engine.engine import Deliver, Engine
from affidavit.engine.ids import is_invocation_id, new_invocation_id
from affidavit.engine.location import JOURNAL_WORDS, unplaced
from affidavit.engine.operations import OperationError, poll_failure
from affidavit.engine.recorder import Deferred, stored_envelope
from affidavit.engine.recovery import (
    READ_DECLINED,
    READ_RETRY,
    READ_RETRY_AFTER,
    RESULT_UNVERIFIED,
    UNAVAILABLE_RETRY_AFTER,
    UNREADABLE,
    CallNotRecorded,
    call_failure,
    carries_key,
    internal_failure,
    read_failure,
    result_failure,
    unread,
    unreadable,
    unrecorded,
)
from affidavit.engine.settings import EngineSettings
from affidavit.engine.sink import RESULT_CHUNK

__all__ = [
    "JOURNAL_WORDS",
    "READ_DECLINED",
    "READ_RETRY",
    "READ_RETRY_AFTER",
    "RESULT_CHUNK",
    "RESULT_UNVERIFIED",
    "UNAVAILABLE_RETRY_AFTER",
    "UNREADABLE",
    "CallControl",
    "CallNotRecorded",
    "Deferred",
    "Deliver",
    "Engine",
    "EngineSettings",
    "NotAnswered",
    "OperationError",
    "call_failure",
    "carries_key",
    "internal_failure",
    "is_invocation_id",
    "new_invocation_id",
    "poll_failure",
    "read_failure",
    "result_failure",
    "stored_envelope",
    "tune_collector",
    "unplaced",
    "unread",
    "unreadable",
    "unrecorded",
]
