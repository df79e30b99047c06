"""A credential injected into the query is not kept by urllib's URL cache after its call.

CPython's ``urllib.parse.urlsplit`` is an ``lru_cache`` (the last 128 URLs, module-wide): a
request URL split through it -- ``query:`` injection puts the credential there -- or a
Location echoing it would stay in the process for as long as 128 other URLs take to push it
out, past the try that docs/security.md ("Credential lifetime") says the credential ends with.
The broker splits such URLs uncached (``adapters/http/urls.split_url``) and empties the cache
after the joins it cannot do otherwise (``join_url``, ``drop_fragment``).  The cache is read
through the garbage collector's view of the ``lru_cache`` object (its dict of keys).
"""

from __future__ import annotations

import gc
import os
import urllib.parse
from pathlib import Path

import pytest
import trio

from tests.http.hostile import HostileServer, Received, Reply, scripts

from .helpers import TOKEN_ENV, http_target, open_broker, write_config

LIMIT = 20
CANARY = "canary" + os.urandom(8).hex()


def _cached_urls() -> list[str]:
    """Every argument urllib's ``urlsplit`` cache holds (empty when it is not cached)."""
    found: list[str] = []
    for obj in gc.get_referents(urllib.parse.urlsplit):
        if isinstance(obj, dict):
            found += [repr(key) for key in obj]
    return found


def _echo_location(req: Received) -> Reply:
    if req.target.startswith("/landing"):
        return Reply(200, body=b"landed")  # one redirect: no later join empties the cache
    # Same origin, the request target (credential included) quoted back in the path -- where
    # taking the credential parameter off the query does not reach it.
    return Reply(302, headers=[("Location", f"/landing{req.target.replace('?', '/')}#frag")])


@pytest.fixture
def probe_works() -> None:
    """The probe sees what the cache holds: a URL split through the cached function is found."""
    # Every CPython the broker supports (3.11+) caches it; one that does not fails here, for
    # the test to be rewritten -- never skipped silently (tests/external.py's rule).
    assert hasattr(urllib.parse.urlsplit, "cache_info"), "urlsplit keeps no cache here"
    urllib.parse.urlsplit(f"https://probe.invalid/?k={CANARY}-probe")
    assert any(f"{CANARY}-probe" in url for url in _cached_urls())
    urllib.parse.urlsplit.cache_clear()


async def test_a_query_credential_is_not_left_in_urllibs_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, probe_works: None
) -> None:
    monkeypatch.setenv(TOKEN_ENV, CANARY)
    async with (
        HostileServer.running(scripts.serve(Reply(200, body=b"ok"))) as plain,
        HostileServer.running(scripts.serve(_echo_location)) as echoing,
    ):
        targets = {
            "plain": http_target(plain.url, inject="query:api_key"),
            "echoing": http_target(echoing.url, inject="query:api_key", follow_redirects=True),
        }
        cfg = write_config(tmp_path, targets)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                for name in targets:
                    await broker.call({"target": name, "method": "GET", "path": "/p?q=1"})
    # The servers were sent the credential: its absence below is not a call that lacked it.
    assert any(CANARY in r.target for r in plain.requests)
    assert any(CANARY in r.target for r in echoing.requests)
    assert [r.target.startswith("/landing") for r in echoing.requests] == [False, True]
    assert [url for url in _cached_urls() if CANARY in url] == []


def test_a_journal_urls_password_is_not_left_in_urllibs_cache(probe_works: None) -> None:
    """A PostgreSQL journal's URL is redacted for every message that names it (``where``), and
    its location read for the checks at start (``engine/location.py``): both split it."""
    from affidavit.engine.location import JOURNAL_WORDS, unplaced
    from affidavit.journal.backend import where

    url = f"postgresql://broker:{CANARY}@db.invalid:5432/journal?sslpassword={CANARY}"
    assert CANARY not in where(url)
    unplaced(sorted(JOURNAL_WORDS)[0], 'connection to server at "db.invalid" failed', url)
    assert [key for key in _cached_urls() if CANARY in key] == []


def _hop_origins() -> list[str]:
    """Every argument ``cleartext_hop``'s cache holds (its keys, through the collector)."""
    from affidavit.adapters.http.urls import cleartext_hop

    found: list[str] = []
    for obj in gc.get_referents(cleartext_hop):
        if isinstance(obj, dict):
            found += [repr(key) for key in obj]
    return found


async def test_a_refused_locations_origin_is_not_kept_by_cleartext_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cleartext_hop`` keeps what it was asked (issue 15: an origin is parsed once), so it is
    asked only of configured origins -- a redirect's once its policy allowed it, never an
    origin a remote wrote into a Location (which may echo the credential: here its host)."""
    from affidavit.adapters.http.urls import cleartext_hop

    monkeypatch.setenv(TOKEN_ENV, CANARY)
    echo = f"http://{CANARY}.invalid/next"
    async with HostileServer.running(
        scripts.serve(Reply(302, headers=[("Location", echo)]))
    ) as server:
        cfg = write_config(tmp_path, {"api": http_target(server.url, follow_redirects=True)})
        cleartext_hop.cache_clear()
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call({"target": "api", "method": "GET", "path": "/p"})
    assert len(server.requests) == 1  # the 302 is the result: the Location was not followed
    assert env["result"]["status"] == 302
    assert any(server.url.split("/")[2] in key for key in _hop_origins())  # the probe sees
    assert [key for key in _hop_origins() if CANARY in key] == []
