"""``affidavit.toml``: the broker's configuration — locating and loading it (``loader``), the
sample ``affidavit init`` writes (``sample``), and, re-exported from ``affidavit.schema``, the
error type (and an unreadable file's code), the target snapshot the engine binds to each
invocation and a target's result limit (``result_limit``: its ``max_result`` or the default)
and the files that decide whom it trusts (``trust_anchors``)."""

from affidavit.schema import (
    CONFIG_UNREADABLE,
    ConfigError,
    Target,
    Timeouts,
    account,
    canonical_json,
    parse_duration,
    result_limit,
    snapshot,
    snapshot_hash,
    trust_anchors,
    trusted,
)

from .address import console_address, console_origin, is_loopback, served_through_tls
from .loader import (
    CONFIG_ENV,
    DEFAULT_CONFIG,
    Config,
    ConfigUnread,
    JournalConfig,
    config_from_dict,
    config_path,
    load_config,
    parse_config,
    read_config,
    send_windows,
)
from .sample import sample_config
from .service import SERVICE, ServiceConfig

__all__ = [
    "CONFIG_ENV",
    "CONFIG_UNREADABLE",
    "DEFAULT_CONFIG",
    "SERVICE",
    "Config",
    "ConfigError",
    "ConfigUnread",
    "JournalConfig",
    "ServiceConfig",
    "Target",
    "Timeouts",
    "account",
    "canonical_json",
    "config_from_dict",
    "config_path",
    "console_address",
    "console_origin",
    "is_loopback",
    "load_config",
    "parse_config",
    "parse_duration",
    "read_config",
    "result_limit",
    "sample_config",
    "send_windows",
    "served_through_tls",
    "snapshot",
    "snapshot_hash",
    "trust_anchors",
    "trusted",
]
