"""The checks every interface runs on action JSON text before parsing it -- size, UTF-8,
nesting; no field named twice, no ``NaN`` (``affidavit.protocols.actions.load_action_json``,
``strict_json``) -- for the interfaces that sit above the API (the daemon, MCP's transport), as
the CLI's embedded ``call`` runs them."""

from affidavit.protocols.actions import MAX_DEPTH, ActionInvalid, load_action_json, strict_json

__all__ = ["MAX_DEPTH", "ActionInvalid", "load_action_json", "strict_json"]
