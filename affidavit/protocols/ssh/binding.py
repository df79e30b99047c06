"""SSH binding: a validated ``SshAction`` + ``SshTarget`` + credential → one exec via the
ssh-python driver (``affidavit.adapters.ssh``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from affidavit.adapters.base import AttemptContext, RemoteResult
from affidavit.adapters.ssh import (
    SSH_TABLE,
    CredentialInvalid,
    SshCredential,
    SshTimeouts,
    perform,
    prepare_credential,
)
from affidavit.adapters.ssh import SshTarget as AdapterTarget
from affidavit.protocols.spec import Prepared
from affidavit.secrets.credentials import Credential, CredentialError

from .action import SshAction
from .target import SshTarget

__all__ = ["SshBinding"]


@dataclass(frozen=True)
class SshRequest:
    target: AdapterTarget
    credential: SshCredential
    command: str
    stdin: bytes | None


class SshBinding:
    kind = "ssh"
    table = SSH_TABLE

    def start_warnings(self, targets: Sequence[SshTarget]) -> list[str]:
        return []  # known_hosts and keys are the target's files; nothing is read from elsewhere

    def connect_timeout(self, target: SshTarget) -> float:
        return float(target.timeout.connect)

    def prepare(
        self,
        action: SshAction,
        target: SshTarget,
        credential: Credential,
        idempotency_key: str | None,
        trusted: Mapping[str, str],
    ) -> Prepared:
        kind = "password" if target.auth == "password" else "private_key"
        try:
            cred = prepare_credential(credential.value, kind=kind)
        except CredentialInvalid as exc:
            # The message is fixed text; the operator's detail names the reference.
            raise CredentialError(exc.code, str(exc), ref=credential.ref) from None
        timeouts = SshTimeouts(
            connect=target.timeout.connect, auth=target.timeout.connect, exec=target.timeout.total
        )
        request = SshRequest(
            target=AdapterTarget(target.host, target.port, target.user, target.host_keys, timeouts),
            credential=cred,
            command=action.command,
            stdin=action.stdin,
        )
        evidence: dict[str, Any] = {"auth": cred.kind}
        if cred.public_fingerprint:
            evidence["client_key"] = cred.public_fingerprint
        # The redactor derives every form, and a PEM key's body lines, from the value.
        return Prepared(request=request, secrets=(credential.value,), evidence=evidence)

    async def perform(self, prepared: Prepared, ctx: AttemptContext) -> RemoteResult:
        req: SshRequest = prepared.request
        return await perform(req.target, req.credential, req.command, req.stdin, ctx)

    async def aclose(self) -> None:
        return None
