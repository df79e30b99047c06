"""Reconciling an unknown outcome (docs/approvals.md, "Reconciliation"): an operator's
attestation, or the target's configured query run as a linked invocation (``service``)."""

from .service import ATTESTABLE, attest, query

__all__ = ["ATTESTABLE", "attest", "query"]
