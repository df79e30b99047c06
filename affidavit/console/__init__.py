"""The operator console (docs/console.md): a small web application the daemon serves on a
loopback TCP address, where an operator sees the evidence and decides approvals and
reconciliations -- through the same ``Broker`` functions as the CLI and the daemon's API."""

from .app import COOKIE, Console
from .auth import IDLE_TTL, TOKEN_TTL, Sessions, TokenDirError, TokenStore, login_url, token_dir
from .diagram import lifecycle_svg, path_of
from .handlers import Slot
from .peer import listener_owners, socket_owner
from .request import Refused
from .text import visible

__all__ = [
    "COOKIE",
    "IDLE_TTL",
    "TOKEN_TTL",
    "Console",
    "Refused",
    "Sessions",
    "Slot",
    "TokenDirError",
    "TokenStore",
    "lifecycle_svg",
    "listener_owners",
    "login_url",
    "path_of",
    "socket_owner",
    "token_dir",
    "visible",
]
