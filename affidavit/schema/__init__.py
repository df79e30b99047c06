"""The configuration's schema language: a setting is declared once (``Field``) and parsing,
unknown-key errors, the bound snapshot and the docs table are derived from the declaration.

``affidavit.config`` reads ``affidavit.toml`` with it; every protocol declares its target schema
with it (``TargetSchema``: ``COMMON`` plus the protocol's own fields).  It knows no protocol.
"""

from .approval import ApprovalPolicy, approval_field
from .fields import Field, Key, LoadContext, Read, Schema, content, doc_table, same
from .section import (
    CONFIG_INVALID,
    CONFIG_NOT_FOUND,
    CONFIG_UNREADABLE,
    MISSING,
    ConfigError,
    Section,
    kind_of,
)
from .target import (
    BUDGET,
    COMMON,
    CREDENTIAL,
    DEFAULT_MAX_RESULT,
    MAX_RESULT,
    TIMEOUT,
    Target,
    TargetSchema,
    Timeouts,
    account,
    canonical_json,
    canonical_value,
    result_limit,
    schema_of,
    snapshot,
    snapshot_hash,
    trust_anchors,
    trusted,
)
from .values import check_host, duration_setting, host_for_url, host_setting, parse_duration

__all__ = [
    "BUDGET",
    "COMMON",
    "CONFIG_INVALID",
    "CONFIG_NOT_FOUND",
    "CONFIG_UNREADABLE",
    "CREDENTIAL",
    "DEFAULT_MAX_RESULT",
    "MAX_RESULT",
    "MISSING",
    "TIMEOUT",
    "ApprovalPolicy",
    "ConfigError",
    "Field",
    "Key",
    "LoadContext",
    "Read",
    "Schema",
    "Section",
    "Target",
    "TargetSchema",
    "Timeouts",
    "account",
    "approval_field",
    "canonical_json",
    "canonical_value",
    "check_host",
    "content",
    "doc_table",
    "duration_setting",
    "host_for_url",
    "host_setting",
    "kind_of",
    "parse_duration",
    "result_limit",
    "same",
    "schema_of",
    "snapshot",
    "snapshot_hash",
    "trust_anchors",
    "trusted",
]
