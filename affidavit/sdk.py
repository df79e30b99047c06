"""``affidavit.sdk``: the public import name of the checked calling style
(``affidavit.api.sdk``), kept because callers write ``from affidavit.sdk import call_checked``."""

from affidavit.api.sdk import (
    AUTO_RETRY_HINTS,
    NOT_SENT_CODES,
    AffidavitError,
    BatchItemsError,
    call_checked,
)

__all__ = [
    "AUTO_RETRY_HINTS",
    "NOT_SENT_CODES",
    "AffidavitError",
    "BatchItemsError",
    "call_checked",
]
