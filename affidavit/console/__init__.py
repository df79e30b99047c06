"""The operator console (docs/console.md): a small web application the daemon serves on a
loopback TCP address, where an operator sees the evidence and decides approvals and
reconciliations -- through the same ``Broker`` functions as the CLI and the daemon's API."""

from .app import COOKIE, Console
from .auth import TOKEN_TTL, Sessions, TokenStore, login_url, token_dir
from .diagram import lifecycle_svg, path_of

__all__ = [
    "COOKIE",
    "TOKEN_TTL",
    "Console",
    "Sessions",
    "TokenStore",
    "lifecycle_svg",
    "login_url",
    "path_of",
    "token_dir",
]
