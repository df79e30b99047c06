"""Reading one TOML table: typed getters that name the field path, and leftover keys as errors.

Every problem is a ``ConfigError`` naming the field path to fix (``targets.billing.inject``) and
why — never a traceback.  Unknown settings are errors too: a misspelt ``idempotent`` silently
ignored would make the broker retry (or refuse to retry) on a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CONFIG_INVALID",
    "CONFIG_NOT_FOUND",
    "CONFIG_UNREADABLE",
    "MISSING",
    "ConfigError",
    "Section",
    "kind_of",
]


CONFIG_INVALID = "CONFIG_INVALID"
"""A setting, or the file's TOML, is wrong: the field path (or the TOML's line) says where."""
CONFIG_NOT_FOUND = "CONFIG_NOT_FOUND"
"""No file at the config path (``--config``, ``$AFFIDAVIT_CONFIG``, ``./affidavit.toml``)."""
CONFIG_UNREADABLE = "CONFIG_UNREADABLE"
"""The file is there but cannot be read (permissions, a directory)."""


class ConfigError(Exception):
    """A configuration problem: ``str()`` is ``"<file>: <field>: <message>"``; ``code`` is its
    stable kind (``CONFIG_INVALID``, ``CONFIG_NOT_FOUND``, ``CONFIG_UNREADABLE``), which the
    command line prints before it."""

    def __init__(
        self,
        field: str,
        message: str,
        file: str | Path | None = None,
        code: str = CONFIG_INVALID,
    ) -> None:
        self.field = field
        self.message = message
        self.file = str(file) if file is not None else None
        self.code = code
        super().__init__(field, message)

    def __str__(self) -> str:
        parts = [self.file or "<config>"]
        if self.field:
            parts.append(self.field)
        parts.append(self.message)
        return ": ".join(parts)


MISSING: Any = object()
"""The default of a required setting."""


def kind_of(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


class Section:
    """One TOML table being read; remembers which keys were consumed so leftovers are errors."""

    def __init__(self, data: object, prefix: str) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(prefix, f"must be a table, not {kind_of(data)}")
        self.data: Mapping[str, Any] = data
        self.prefix = prefix
        self.seen: set[str] = set()

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def get(self, key: str, default: Any = MISSING) -> Any:
        self.seen.add(key)
        if key in self.data:
            return self.data[key]
        if default is MISSING:
            raise ConfigError(self.path(key), "is required")
        return default

    def has(self, key: str) -> bool:
        return key in self.data

    def string(self, key: str, default: Any = MISSING, *, max_len: int = 4096) -> Any:
        value = self.get(key, default)
        if value is default and default is not MISSING:
            return value
        if not isinstance(value, str):
            raise ConfigError(self.path(key), f"must be a string, not {kind_of(value)}")
        if not value:
            raise ConfigError(self.path(key), "must not be empty")
        if len(value) > max_len:
            raise ConfigError(self.path(key), f"is longer than {max_len} characters")
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ConfigError(self.path(key), "must not contain control characters")
        return value

    def integer(self, key: str, default: Any, lo: int, hi: int) -> int:
        value = self.get(key, default)
        # bool is an int subclass in Python; `budget = true` is a mistake, not 1.
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(self.path(key), f"must be an integer, not {kind_of(value)}")
        if not lo <= value <= hi:
            raise ConfigError(self.path(key), f"must be between {lo} and {hi}")
        return value

    def boolean(self, key: str, default: Any) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(self.path(key), f"must be true or false, not {kind_of(value)}")
        return value

    def string_list(self, key: str, default: Any = MISSING) -> list[str]:
        value = self.get(key, default)
        if not isinstance(value, list):
            raise ConfigError(self.path(key), f"must be an array of strings, not {kind_of(value)}")
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{self.path(key)}[{i}]", "must be a non-empty string")
            if any(c in item for c in "\r\n\x00"):
                raise ConfigError(f"{self.path(key)}[{i}]", "must not contain CR, LF or NUL")
        return value

    def finish(self, allowed: tuple[str, ...] = ()) -> None:
        for key in self.data:
            if key not in self.seen:
                hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
                raise ConfigError(self.path(str(key)), f"unknown setting{hint}")
