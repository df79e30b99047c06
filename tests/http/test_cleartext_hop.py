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
        assert not urls.cleartext_hop("https://192.0.2.7:443", None)  # TLS: parsed, then False
        assert not urls.cleartext_hop("https://192.0.2.7:443", "http://192.0.2.9:3128")
    assert parses == [
        "http://192.0.2.7:8080",
        "http://127.0.0.1:8080",
        "http://127.0.0.1:8080",
        "http://127.0.0.1:3128",
        "http://127.0.0.1:8080",
        "http://192.0.2.9:3128",
        "https://192.0.2.7:443",
        "https://192.0.2.7:443",
        "http://192.0.2.9:3128",
    ]


def test_a_url_that_does_not_parse_is_refused_every_time_and_not_kept(
    parses: list[str],
) -> None:
    secret = "http://user:s3cret-0001@192.0.2.7:3128"
    for _ in range(2):
        with pytest.raises(urls.BadUrl, match="userinfo"):
            urls.cleartext_hop("http://192.0.2.7:8080", secret)
    assert parses == ["http://192.0.2.7:8080", secret] * 2
    assert urls.cleartext_hop.cache_info().currsize == 0


@pytest.mark.parametrize(
    ("origin", "proxy"),
    [
        ("https://192.0.2.7:443", "http://user:s3cret-0002@192.0.2.9:3128"),
        ("https://bad host:443", None),
        ("https://[::1:443", None),
    ],
)
def test_an_https_origin_or_its_proxy_that_does_not_parse_is_refused_and_not_kept(
    parses: list[str], origin: str, proxy: str | None
) -> None:
    """TLS or not, nothing is answered -- nor kept -- for a URL that does not parse (the
    docstring's promise: an https:// one was answered False unparsed, and cached)."""
    for _ in range(2):
        with pytest.raises(urls.BadUrl):
            urls.cleartext_hop(origin, proxy)
    assert urls.cleartext_hop.cache_info().currsize == 0
