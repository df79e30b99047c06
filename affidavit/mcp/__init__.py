"""``affidavit mcp``: the broker as Model Context Protocol tools over stdio (docs/mcp.md).

``server`` runs one connection on the SDK's low-level server; ``tools`` declares the tools;
``render`` writes their answers' text; ``backends`` does their work in an embedded ``Broker`` or
through the daemon's ``Client``; ``transport`` is stdio that knows which answers were written.

With ``--socket`` (or ``$AFFIDAVIT_SOCKET``) the process is a thin proxy that holds no secret and
imports neither the engine nor the journal; ``run`` picks the backend."""

from .run import McpError, run

__all__ = ["McpError", "run"]
