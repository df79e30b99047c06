"""The checks every interface runs on action JSON text before parsing it -- size, UTF-8,
nesting; no field named twice, no ``NaN`` (``affidavit.protocols.actions.load_action_json``)
-- for the daemon, as the CLI's embedded ``call`` runs them.  (MCP's transport reads a
request's text with the same strict reader, ``affidavit.strictjson``, which loads nothing of
the broker.)"""

from affidavit.protocols.actions import (
    MAX_DEPTH,
    ActionInvalid,
    action_size_limit,
    load_action_json,
)

__all__ = ["MAX_DEPTH", "ActionInvalid", "action_size_limit", "load_action_json"]
