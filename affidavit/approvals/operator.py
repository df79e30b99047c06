"""Who an operator is, and who may act as one.

Seed: "An operator is entitled to determine the outcome of an unknown attempt after inspecting
the remote system, but that fact must not be passed off as a response the broker received";
DESIGN: "Operators act through channels the agent cannot reach: approvals, attestation and the
console record the operator's identity; an MCP tool never approves or attests."

The identity is the kernel's word, never the caller's: through the daemon, the socket peer's
uid and groups (SO_PEERCRED, ``affidavit.daemon.peer``); embedded, this process's own user.
``[service] operator_uids`` / ``operator_gids`` say who is an operator, ``allow_self_approval``
whether one may decide on a request their own uid made.  Embedded, the check guards against
mistakes only: whoever can write the journal and read its key could write any row -- the
daemon is the boundary (docs/deployment.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from affidavit.engine.approval import admits_uid

__all__ = ["Operator", "OperatorError", "OperatorPolicy"]


class OperatorError(Exception):
    """An operator action that is refused or impossible; ``code`` is stable, ``status`` the
    daemon API's HTTP status, ``message`` for the human, ``field`` the part of the request to
    change when one is (``blind``)."""

    def __init__(
        self, code: str, message: str, status: int = 409, field: str | None = None
    ) -> None:
        self.code = code
        self.message = message
        self.status = status
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Operator:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    name: str | None = None
    via: str = "embedded"
    """``embedded`` (this process's user) or ``socket`` (the daemon's peer)."""

    @classmethod
    def current(cls) -> Operator:
        """This process's user: the identity of an operator command run embedded."""
        return cls(os.getuid(), os.getgid(), tuple(os.getgroups()), _name(os.getuid()))

    @classmethod
    def peer(cls, uid: int, gid: int, groups: tuple[int, ...]) -> Operator:
        return cls(uid, gid, groups, _name(uid), "socket")

    def attrs(self) -> dict[str, Any]:
        """As the journal records it (APPROVAL_GRANTED/DENIED, RECONCILED)."""
        return {"uid": self.uid, "name": self.name, "via": self.via}

    def describe(self) -> str:
        """The RECONCILED event's ``observer``: ``operator:uid=1001(alice)``."""
        who = f"uid={self.uid}" + (f"({self.name})" if self.name else "")
        return f"operator:{who}"


def _name(uid: int) -> str | None:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return None


@dataclass(frozen=True)
class OperatorPolicy:
    """``[service] operator_uids`` / ``operator_gids`` / ``allow_self_approval``."""

    uids: frozenset[int]
    gids: frozenset[int]
    self_approval: bool = False

    @classmethod
    def of(cls, service: Any) -> OperatorPolicy:
        return cls(
            frozenset(service.operator_uids),
            frozenset(service.operator_gids),
            bool(service.allow_self_approval),
        )

    def is_operator(self, who: Operator) -> bool:
        if who.uid in self.uids or who.gid in self.gids:
            return True
        return any(g in self.gids for g in who.groups)

    def admitted_by(self, who: Operator) -> dict[str, int]:
        """What admits ``who`` (an operator: ``require`` passed), as APPROVAL_GRANTED records
        it under ``operator.admitted``: ``{"uid": n}`` when the uid is listed, else
        ``{"gid": n}``, the first of its primary and supplementary groups (the kernel's word,
        as the decision took it) listed.  The dispatch gate re-checks exactly that against the
        settings as they are then (``Grant.disowned``), with no user-database lookup: a group
        the kernel gave the caller need not be one NSS knows (``sg``, a container, a host
        sharing the journal that does not know the uid)."""
        if who.uid in self.uids:
            return {"uid": who.uid}
        gid = next(g for g in (who.gid, *who.groups) if g in self.gids)
        return {"gid": gid}

    def admits_uid(self, uid: int) -> bool:
        """``affidavit.engine.approval.admits_uid`` by this policy: for sharing the console's
        places, where only a socket's owner uid is known."""
        return admits_uid(self.uids, self.gids, uid)

    def require(self, who: Operator, action: str) -> None:
        if not self.is_operator(who):
            raise OperatorError(
                "NOT_AN_OPERATOR",
                f"uid {who.uid} may not {action}: not in [service] operator_uids / operator_gids",
                403,
            )

    def require_not_requester(self, who: Operator, requester: object) -> None:
        if not self.self_approval and isinstance(requester, int) and requester == who.uid:
            raise OperatorError(
                "SELF_APPROVAL",
                f"uid {who.uid} made this request and may not decide on it "
                "([service] allow_self_approval is off)",
                403,
            )
