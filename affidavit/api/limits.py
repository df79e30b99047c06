"""The checks every interface runs on action JSON text before parsing it -- size, UTF-8,
nesting (``affidavit.protocols.actions.load_action_json``) -- for the interfaces that sit above
the API (the daemon), as the CLI's embedded ``call`` runs them."""

from affidavit.protocols.actions import MAX_DEPTH, ActionInvalid, load_action_json

__all__ = ["MAX_DEPTH", "ActionInvalid", "load_action_json"]
