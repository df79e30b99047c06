#!/usr/bin/env python3
"""Exit 0 when the Python running this refuses ``pip install`` under PEP 668 (an
``EXTERNALLY-MANAGED`` marker in its standard library's directory, as Debian's and Ubuntu's
system Python carry), 1 otherwise; ``.ci/run`` then installs into a virtual environment instead.

PEP 668: the marker binds only outside a virtual environment (``sys.prefix`` is then
``sys.base_prefix``); inside one, pip installs whatever the base interpreter carries.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path


def externally_managed(prefix: str, base_prefix: str, stdlib: Path) -> bool:
    return prefix == base_prefix and (stdlib / "EXTERNALLY-MANAGED").is_file()


if __name__ == "__main__":
    managed = externally_managed(sys.prefix, sys.base_prefix, Path(sysconfig.get_path("stdlib")))
    sys.exit(0 if managed else 1)
