"""``cleartext_hop`` parses an origin once, not once per call (issue 15, c=1).

Every complete answer asks it of its own origin (the client's ``_attribution``, docs/proxies.md
"The evidence"); parsing the same ``scheme://host:port`` again each time was ~12 us of the
loop's work after the response.  What it answers is unchanged, and what it keeps is an origin
and a proxy -- ``scheme://host:port`` strings the config and the exchange build, never a URL a
credential or a Location is in.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from affidavit.adapters.http import urls


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The URLs ``cleartext_hop`` parses, from an empty cache."""
    seen: list[str] = []
    parse = urls.parse_url

    def counted(url: str, **kw: Any) -> urls.Url:
        seen.append(url)
        return parse(url, **kw)

    clear = getattr(urls.cleartext_hop, "cache_clear", lambda: None)  # (no cache: the test fails)
    clear()
    monkeypatch.setattr(urls, "parse_url", counted)
    yield seen
    clear()


def test_an_origin_is_parsed_once_whatever_the_calls_it_answers(parses: list[str]) -> None:
    for _ in range(3):
        assert urls.cleartext_hop("http://192.0.2.7:8080", None)
        assert not urls.cleartext_hop("http://127.0.0.1:8080", None)
        assert not urls.cleartext_hop("http://127.0.0.1:8080", "http://127.0.0.1:3128")
        assert urls.cleartext_hop("http://127.0.0.1:8080", "http://192.0.2.9:3128")
        assert not urls.cleartext_hop("https://192.0.2.7:443", None)  # TLS: never parsed
    assert parses == [
        "http://192.0.2.7:8080",
        "http://127.0.0.1:8080",
        "http://127.0.0.1:3128",
        "http://192.0.2.9:3128",
    ]


def test_a_url_that_does_not_parse_is_refused_every_time_and_not_kept(
    parses: list[str],
) -> None:
    secret = "http://user:s3cret-0001@192.0.2.7:3128"
    for _ in range(2):
        with pytest.raises(urls.BadUrl, match="userinfo"):
            urls.cleartext_hop("http://192.0.2.7:8080", secret)
    assert parses == [secret, secret]
    assert urls.cleartext_hop.cache_info().currsize == 0
