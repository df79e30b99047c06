"""A followed hop's path as ``hops[].path`` records it -- and a reconcile reason quotes it
("answered by a redirect to PATH"): no query, no ``;`` parameters (a ``;jsessionid=`` session
token), the credential's forms scrubbed, at most ``HOP_PATH_MAX`` characters
(``adapters/http/client.py``, ``hop_path``)."""

from __future__ import annotations

import pytest

from affidavit.adapters.http.client import HOP_PATH_MAX, hop_path
from affidavit.secrets.redaction import Redactor

SECRET = "s3cr3t-T0KEN"


def _scrub(text: str) -> str:
    return text.replace(SECRET, "[REDACTED]")


@pytest.mark.parametrize(
    ("path_query", "recorded"),
    [
        ("/v1/login?next=/v1/charges&token=abc", "/v1/login"),
        ("/v1/login;jsessionid=A1B2C3D4", "/v1/login"),
        ("/app;jsessionid=A1B2/login;v=2?x=1", "/app/login"),
        ("/v1/maintenance", "/v1/maintenance"),
        (f"/v1/{SECRET}/page", "/v1/[REDACTED]/page"),
        ("/v1/a%3Bb", "/v1/a%3Bb"),
    ],
    ids=["query", "jsessionid", "params-in-segments", "plain", "scrubbed", "encoded-semicolon"],
)
def test_a_hop_path_keeps_the_path_alone(path_query: str, recorded: str) -> None:
    assert hop_path(path_query, _scrub) == recorded


def test_a_long_hop_path_is_cut_with_a_marker() -> None:
    long = "/" + "x" * 5000
    recorded = hop_path(long, _scrub)
    assert len(recorded) == HOP_PATH_MAX
    assert recorded.endswith("...[cut]") and recorded.startswith("/xxx")
    exact = "/" + "y" * (HOP_PATH_MAX - 1)
    assert hop_path(exact, _scrub) == exact


@pytest.mark.parametrize(
    "path_query", ["/v1/k3y;Secret-PART/x", "/cb/k3y;Secret-PART?x=1", "/k3y;Secret-PART"]
)
def test_a_credential_holding_a_semicolon_is_scrubbed_whole_before_the_parameters_go(
    path_query: str,
) -> None:
    """The parameters stripped first cut such a credential at its ``;``: no longer whole, the
    real redactor missed it and its head (``k3y``) was recorded (review rv52c2)."""
    redactor = Redactor([b"k3y;Secret-PART"])
    recorded = hop_path(path_query, redactor.scrub_text)
    assert "k3y" not in recorded and "Secret" not in recorded, recorded
    assert recorded.startswith("/"), recorded
