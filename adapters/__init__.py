"""Protocol adapters: one sub-package per protocol, each a sans-IO protocol machine plus a trio
driver.  ``load_all()`` imports every sub-package so their tables register themselves."""

from __future__ import annotations

import importlib
import pkgutil

__all__ = ["load_all"]


def load_all() -> list[str]:
    """Import every adapter sub-package (registering its protocol table); return their names."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")
            names.append(info.name)
    return sorted(names)
