"""The Python API: ``Broker`` (the engine in the caller's process) and the checked SDK style."""

from affidavit.api.broker import Broker
from affidavit.api.sdk import AffidavitError, call_checked

__all__ = ["AffidavitError", "Broker", "call_checked"]
