"""HTTP binding: a validated ``HttpAction`` + ``HttpTarget`` + credential → ``HttpRequest``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from affidavit import __version__
from affidavit.adapters.base import AttemptContext, RemoteResult
from affidavit.adapters.http import HTTP_TABLE, HttpClient, HttpRequest, RedirectDecision, Timeouts
from affidavit.adapters.http.trust import start_warnings
from affidavit.adapters.http.urls import split_url
from affidavit.protocols.actions import ActionInvalid
from affidavit.protocols.spec import Prepared
from affidavit.secrets.credentials import Credential, apply_query, inject_http
from affidavit.secrets.redaction import redactor

from .action import HttpAction, needs_approval, query_param
from .decoding import BodyDecoding
from .params import check_request_query, credential_spelling
from .reconcile import status_only_warnings
from .segments import climbs
from .target import HttpTarget, origin_of

__all__ = ["LOCATION_REFUSED", "HttpBinding"]


class HttpBinding:
    kind = "http"
    table = HTTP_TABLE

    def __init__(self) -> None:
        self._client = HttpClient()

    def start_warnings(self, targets: Sequence[HttpTarget]) -> list[str]:
        """``trust.start_warnings``: the system store is used by a target without a ca_file
        whose url or a redirect origin is https://; and a reconcile query whose committed_if
        reads a status alone (``reconcile.status_only_warnings``)."""
        used = any(
            t.ca_file is None
            and any(o.startswith("https://") for o in (t.origin, *t.redirect_origins))
            for t in targets
        )
        return [*start_warnings(os.environ, used), *status_only_warnings(targets)]

    def connect_timeout(self, target: HttpTarget) -> float:
        return float(target.timeout.connect)

    def prepare(
        self,
        action: HttpAction,
        target: HttpTarget,
        credential: Credential,
        idempotency_key: str | None,
        trusted: Mapping[str, str],
    ) -> Prepared:
        injection = inject_http(target.inject, credential)
        path = target.base_path.rstrip("/") + action.path
        url = target.origin + apply_query(path, injection)
        headers = [("User-Agent", f"affidavit/{__version__}"), *action.headers, *injection.headers]
        evidence: dict[str, Any] = {"inject": target.inject.split(":", 1)[0]}
        redirect_policy = _redirect_policy(target)
        if target.follow_redirects and needs_approval(action, target):
            # An operator approves one request: the one shown (docs/approvals.md, "Redirects").
            # The 3xx it is answered with is the result; no request the operator never saw
            # follows it.  Recorded (CREDENTIAL_AUTHORIZED, and bound by the approval).
            redirect_policy = _not_redirected
            evidence["redirects"] = "not_followed"
        contract = target.idempotency
        if contract is not None and idempotency_key is not None:
            # Only for a declared remote contract (seed: "Do not silently add an idempotency
            # header for targets that do not document its semantics").
            headers.append((contract.header, idempotency_key))
            evidence["idempotency_header"] = contract.header
        # The secret and each whole injected value (``Bearer <token>``, ``Basic <base64>``, the
        # percent-encoded query value): a server may echo, base64 or hex-dump either.
        secrets = (
            credential.value,
            *(v.encode("ascii") for _, v in injection.headers),
            *(v.encode("ascii") for _, v in injection.query),
        )
        if target.inject.split(":", 1)[0] == "basic":
            # RFC 7617 user-id ":" password: a server that decodes the header may echo the
            # password alone, which no form of the whole value matches (seed: "Exclude
            # secrets ... from the envelope").
            secrets += (credential.value.split(b":", 1)[1],)
        request = HttpRequest(
            method=action.method,
            url=url,
            headers=headers,
            body=action.body,
            credential_headers=injection.header_names,
            credential_query=injection.query_param,
            credential_query_names=(
                credential_spelling(injection.query_param) if injection.query_param else None
            ),
            ca_file=str(target.ca_file) if target.ca_file else None,
            # The digest the recorded account holds: the handshake trusts these bytes or none.
            ca_sha256=trusted[str(target.ca_file)] if target.ca_file else None,
            proxy=target.proxy,
            trust_cleartext=bool(target.trust_cleartext),
            follow_redirects=target.follow_redirects,
            redirect_policy=redirect_policy,
            idempotent_methods=frozenset(target.idempotent),
            timeouts=Timeouts(
                connect=target.timeout.connect,
                write=target.timeout.total,
                read=target.timeout.total,
            ),
            # A Location holding any redaction form of these is a credential echo: not
            # followed (docs/redaction.md, "Surfaces").
            credential_echo=redactor(secrets).holds,
        )
        return Prepared(request=request, secrets=secrets, evidence=evidence)

    async def perform(self, prepared: Prepared, ctx: AttemptContext) -> RemoteResult:
        # Compressed bodies reach the engine's sink decoded, so its redaction scan sees the
        # bytes a caller would (docs/redaction.md, "Compressed bodies").
        decoding = BodyDecoding(ctx)
        result = await self._client.perform(prepared.request, decoding.context)
        result.summary.update(await decoding.finish())
        return result

    async def aclose(self) -> None:
        await self._client.aclose()


LOCATION_REFUSED = "the Location's path holds what a caller's may not"
"""``redirect_not_followed.reason`` (before the refusal's own words) of a Location to the
target's origin whose query names a method or path override or the credential's parameter."""

APPROVED_NOT_REDIRECTED = "an approved request is sent as approved: its redirect is not followed"


def _not_redirected(method: str, url: str) -> RedirectDecision:
    """The redirect policy of a request that needed approval: no redirect is followed."""
    return RedirectDecision(False, False, APPROVED_NOT_REDIRECTED)


def _redirect_policy(target: HttpTarget) -> Any:
    """Re-validate every hop (seed: "re-validate the target, the credential scope, and the
    method"): the method must be allowed for the target; the destination must be the target's own
    origin or one listed in ``redirect_origins``; the credential stays only on the target's own
    origin and base path (seed: "Do not forward authorization credentials across origins")."""
    base = target.base_path.rstrip("/")
    param = query_param(target)
    hop = not target.escaped_query_values

    def policy(method: str, url: str) -> RedirectDecision:
        if method.upper() not in target.methods:
            return RedirectDecision(False, False, f"method {method} is not allowed for the target")
        try:
            origin = origin_of(url)
        except ValueError:
            return RedirectDecision(False, False, "redirect to a location that is not http(s)")
        if origin != target.origin:
            if origin not in target.redirect_origins:
                return RedirectDecision(False, False, "origin is not in redirect_origins")
            return RedirectDecision(True, keep_credential=False, reason="other origin")
        parts = split_url(url)  # a Location: it may echo the credential
        path = parts.path
        try:
            # What a caller may not put in a path, a Location to the credential's origin may not
            # either (a 307 keeps the method and the credential): an open redirect's
            # ``?_method=DELETE`` would run an allowed POST as a DELETE, another spelling of
            # the credential's parameter would shadow it.  The 3xx is then the result.
            check_request_query(f"{path}?{parts.query}", param, hop)
        except ActionInvalid as exc:
            return RedirectDecision(False, False, f"{LOCATION_REFUSED}: {exc.message}")
        # A caller's path may not climb out of the base path (segments.py); a Location that
        # may -- a dot segment in any reading, escapes that are not UTF-8 -- is out of it.
        in_scope = climbs(path) is None and (
            not base or path == base or path.startswith(base + "/")
        )
        return RedirectDecision(True, keep_credential=in_scope, reason="" if in_scope else "path")

    return policy
