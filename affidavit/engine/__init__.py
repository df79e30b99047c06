"""The engine: runs one invocation through the lifecycle, journaling every transition."""

from affidavit.engine.core import Deliver, Engine, new_invocation_id

__all__ = ["Deliver", "Engine", "new_invocation_id"]
