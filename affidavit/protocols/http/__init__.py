"""HTTP(S): target settings (``target``), the caller's action (``action``) and the binding to
the h11 adapter (``binding``), registered as the ``http`` protocol by the entry point
``affidavit.protocols:http`` (pyproject.toml)."""

from affidavit.adapters.http import HTTP_TABLE
from affidavit.protocols.settle import settle_of
from affidavit.protocols.spec import ProtocolSpec, ReconcileContract

from . import reconcile
from .action import HTTP_ACTION, HttpAction, describe, full_path
from .binding import HttpBinding
from .contracts import HTTP_CONTRACTS
from .target import (
    CREDENTIAL_HEADERS,
    HTTP_TARGET,
    TRANSPORT_HEADERS,
    HttpTarget,
    IdempotencyContract,
    origin_of,
)

__all__ = [
    "CREDENTIAL_HEADERS",
    "HTTP_ACTION",
    "HTTP_CONTRACTS",
    "HTTP_TARGET",
    "PROTOCOL",
    "TRANSPORT_HEADERS",
    "HttpAction",
    "HttpBinding",
    "HttpTarget",
    "IdempotencyContract",
    "full_path",
    "origin_of",
]

PROTOCOL = ProtocolSpec(
    kind="http",
    target=HTTP_TARGET,
    action=HTTP_ACTION,
    binding=HttpBinding,
    table=HTTP_TABLE,
    contracts=HTTP_CONTRACTS,
    describe=describe,
    reconcile=ReconcileContract(query=reconcile.query, verdict=reconcile.verdict, settle=settle_of),
)
