"""A CA file's stat moving over the same bytes is not a change of what a call trusts.

The broker keys its reads of a CA file on the file's stat (adapters/filestat.py): a new stat is
read again, and what the call records and the handshake trusts are the bytes' digest.  So
``touch``, ``chmod`` and ``cp -p`` to a new inode renamed over the file -- each a new stat, the
same bytes -- between a call's validation and its handshake, or between an approval and its
dispatch, is no change: the call is sent, never ``CONFIG_CHANGED`` nor ``APPROVAL_STALE``
(docs/configuration.md, ``ca_file``).  Whether the last read was settled (its stat vouching for
the bytes, kept) or not (read at every use).  A real call through a loopback TLS server.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trustme

import affidavit.adapters.http.trust as http_trust
import affidavit.engine.snapshot as engine_snapshot
from affidavit.statemachine import EventKind as E
from tests.http.hostile import HostileServer, Reply, scripts

from .approvalkit import OPS, approval_config
from .helpers import FakeResolver, custom_resolver, http_target, open_broker, write_config
from .http_rows import LIMIT

GET = {"target": "api", "method": "GET", "path": "/x"}
CHARGE = {"target": "api", "method": "POST", "path": "/v1/charges", "body": '{"amount": 5}'}


def _touch(ca: Path) -> None:
    later = ca.stat().st_mtime_ns + 5_000_000_000
    os.utime(ca, ns=(later, later))


def _chmod(ca: Path) -> None:
    ca.chmod(0o600 if ca.stat().st_mode & 0o077 else 0o644)


def _copied_over(ca: Path) -> None:
    """``cp -p ca.pem ca.pem.new && mv ca.pem.new ca.pem``: a new inode, times kept."""
    new = ca.with_name(ca.name + ".new")
    shutil.copy2(ca, new)
    os.replace(new, ca)


RESTATS: dict[str, Callable[[Path], None]] = {
    "touch": _touch,
    "chmod": _chmod,
    "cp-p-renamed": _copied_over,
}


@pytest.fixture(params=[False, True], ids=["fresh", "settled"])
def settled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Settled: every read's stat vouches for its bytes (as if the file's ctime lay 2 s back),
    so only the stat moving makes the broker read the file again."""
    if request.param:
        monkeypatch.setattr(engine_snapshot, "SETTLED_NS", -(10**18))
        monkeypatch.setattr(http_trust, "SETTLED_NS", -(10**18))
    return bool(request.param)


@pytest.mark.parametrize("restat", RESTATS.values(), ids=RESTATS.keys())
async def test_a_new_stat_over_the_same_ca_bytes_between_validation_and_handshake_is_no_change(
    tmp_path: Path, token: str, settled: bool, restat: Callable[[Path], None]
) -> None:
    ca_authority = trustme.CA()
    ca = tmp_path / "ca.pem"
    ca_authority.cert_pem.write_to_path(str(ca))
    digest = "sha256:" + hashlib.sha256(ca.read_bytes()).hexdigest()
    before = ca.stat()

    async def restat_in_the_window(name: str) -> None:  # after validation, before the connect
        restat(ca)

    closes = Reply(200, headers=[("Connection", "close")])  # each call its own handshake
    async with HostileServer.running(
        scripts.serve(closes), tls=ca_authority.issue_cert("api.test")
    ) as srv:
        url = f"https://api.test:{srv.port}"
        cfg = write_config(tmp_path, {"api": http_target(url, ca_file=str(ca))})
        resolver = FakeResolver({"api.test": "127.0.0.1"})
        with custom_resolver(resolver):
            async with open_broker(cfg) as b:
                with trio.fail_after(LIMIT):
                    first = await b.call(GET)  # the file read, its stat kept when settled
                resolver.on_lookup = restat_in_the_window
                with trio.fail_after(LIMIT):
                    second = await b.call(GET)
                rows = [b.events(env["invocation_id"]) for env in (first, second)]
    after = ca.stat()
    assert (before.st_ino, before.st_ctime_ns, before.st_mtime_ns, before.st_mode) != (
        after.st_ino,
        after.st_ctime_ns,
        after.st_mtime_ns,
        after.st_mode,
    )
    assert "error" not in first and "error" not in second, second
    assert len(srv.requests) == 2 and srv.connections == 2
    accounts = [next(e for e in r if e.kind is E.PREFLIGHT_VALIDATED) for r in rows]
    assert accounts[0].attrs["account_hash"] == accounts[1].attrs["account_hash"]
    for r in rows:
        started = next(e for e in r if e.kind is E.DISPATCH_STARTED)
        assert started.attrs["peer"]["ca_sha256"] == digest


@pytest.mark.parametrize("restat", RESTATS.values(), ids=RESTATS.keys())
async def test_a_new_stat_over_the_same_ca_bytes_after_approval_is_no_change(
    tmp_path: Path, token: str, settled: bool, restat: Callable[[Path], None]
) -> None:
    ca_authority = trustme.CA()
    ca = tmp_path / "ca.pem"
    ca_authority.cert_pem.write_to_path(str(ca))
    closes = Reply(200, headers=[("Connection", "close")])  # each call its own handshake
    async with HostileServer.running(
        scripts.serve(closes), tls=ca_authority.issue_cert("127.0.0.1")
    ) as srv:
        cfg = approval_config(tmp_path, srv.url, ca_file=str(ca))
        async with open_broker(cfg) as b:
            done = []
            for restat_now in (lambda _ca: None, restat):  # the first: the file read and kept
                with trio.fail_after(LIMIT):
                    env = await b.call(CHARGE)
                assert env["error"]["code"] == "APPROVAL_PENDING", env
                iid = env["invocation_id"]
                await b.approve(iid, operator=OPS)
                restat_now(ca)
                with trio.fail_after(LIMIT):
                    await b.dispatch_approved(iid)
                done.append(await b.fetch_result(iid))
    assert all(d is not None and "error" not in d for d in done), done
    assert len(srv.requests) == 2
