"""Protocols: what the service needs to run one kind of target, found through one registry.

A protocol is one ``ProtocolSpec``: its target schema (config keys and validation), its action
schema (parser, fingerprint, idempotency by configuration), its binding to an adapter
(prepare/perform) and its protocol table.  Config loading, action parsing and the broker reach
protocols only through ``get(kind)`` / ``registered()``; protocols are found through the entry
point group ``affidavit.protocols`` (the built-in ``http/`` and ``ssh/`` too) or ``register()``.
Adding a protocol edits nothing here: see docs/adding-a-protocol.md.
"""

from .registry import (
    GROUP,
    ProtocolLoadError,
    get,
    kinds,
    load_bindings,
    register,
    registered,
    unregister,
)
from .spec import (
    Action,
    ActionField,
    ActionSpec,
    Binding,
    Prepared,
    ProtocolSpec,
    Reading,
    ReconcileContract,
    ResultContracts,
)

__all__ = [
    "GROUP",
    "Action",
    "ActionField",
    "ActionSpec",
    "Binding",
    "Prepared",
    "ProtocolLoadError",
    "ProtocolSpec",
    "Reading",
    "ReconcileContract",
    "ResultContracts",
    "get",
    "kinds",
    "load_bindings",
    "register",
    "registered",
    "unregister",
]
