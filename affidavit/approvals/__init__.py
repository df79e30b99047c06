"""Operator actions on approvals (docs/approvals.md): who an operator is (``operator``), and
listing, showing and deciding requests (``service``) -- the rules every interface calls."""

from .operator import Operator, OperatorError, OperatorPolicy
from .service import (
    MAX_NOTE,
    approval_view,
    check_note,
    content,
    decide,
    pending,
    pending_page,
    revoke,
    show,
)

__all__ = [
    "MAX_NOTE",
    "Operator",
    "OperatorError",
    "OperatorPolicy",
    "approval_view",
    "check_note",
    "content",
    "decide",
    "pending",
    "pending_page",
    "revoke",
    "show",
]
