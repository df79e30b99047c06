"""SSH: target settings (``target``), the caller's action (``action``) and the binding to the
ssh-python adapter (``binding``), registered as the ``ssh`` protocol by the entry point
``affidavit.protocols:ssh`` (pyproject.toml)."""

from affidavit.adapters.ssh import SSH_TABLE
from affidavit.protocols.settle import settle_of
from affidavit.protocols.spec import ProtocolSpec, ReconcileContract

from . import reconcile
from .action import SSH_ACTION, SshAction, describe
from .binding import SshBinding
from .target import SSH_TARGET, SshTarget

__all__ = ["PROTOCOL", "SSH_ACTION", "SSH_TARGET", "SshAction", "SshBinding", "SshTarget"]

PROTOCOL = ProtocolSpec(
    kind="ssh",
    target=SSH_TARGET,
    action=SSH_ACTION,
    binding=SshBinding,
    table=SSH_TABLE,
    describe=describe,
    reconcile=ReconcileContract(query=reconcile.query, verdict=reconcile.verdict, settle=settle_of),
)
