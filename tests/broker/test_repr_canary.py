"""``repr`` of what the HTTP binding prepares never shows the credential.

Seed, "Validation and credential injection finish before dispatch": "Do not put credential
contents into either the error or the action record."  A prepared request is the one object
that holds the finished ``Authorization`` header, the credential query parameter and the raw
secret together; its ``repr`` (a debug log line, an assertion message, a traceback's locals
dump) must not print them.
"""

from __future__ import annotations

import base64
import secrets
import urllib.parse
from pathlib import Path

import pytest

from affidavit.config import load_config
from affidavit.protocols.actions import parse_action
from affidavit.protocols.http import HttpBinding
from affidavit.secrets.credentials import Credential

from .helpers import http_target, write_config


@pytest.mark.parametrize("inject", ["bearer", "basic", "header:X-Api-Key", "query:api_key"])
def test_prepared_http_request_repr_hides_the_credential(tmp_path: Path, inject: str) -> None:
    secret = "canary-" + secrets.token_urlsafe(18) + "/+"
    value = f"svc:{secret}" if inject == "basic" else secret
    cfg = load_config(
        write_config(
            tmp_path, {"t": http_target("http://127.0.0.1:9", inject=inject, credential="env:X")}
        )
    )
    target = cfg.targets["t"]
    action = parse_action({"target": "t", "method": "GET", "path": "/p?q=1"}, cfg)
    credential = Credential("env:X", value.encode(), "v1")
    prepared = HttpBinding().prepare(action, target, credential, None, {})
    forms = {
        secret,
        value,
        base64.b64encode(value.encode()).decode(),
        urllib.parse.quote(secret, safe=""),
    }
    for text in (repr(prepared), str(prepared), repr(prepared.request)):
        for form in forms:
            assert form not in text, f"credential form {form!r} in {text}"
