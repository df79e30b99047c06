"""The HTTP driver reads two of trio's private ``SSLStream`` attributes (``_incoming``,
``_ssl_object``): nothing public says what trio's TLS layer holds.  A trio without them fails
the import loudly, naming its version (``connect.check_trio_tls``); a stream that still cannot
be inspected is never written to."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import trio

from affidavit.adapters.base import SetupError
from affidavit.adapters.http import HttpClient
from affidavit.adapters.http.connect import Connection, check_trio_tls

from .fakes import FakeEngine
from .hostile import TlsFixture
from .test_tls_proxy_timeouts import req
from .test_tls_records_before_the_request import V13, RecordPeer, server_context, tickets_only


def _without(name: str) -> Callable[..., trio.SSLStream[Any]]:
    """SSLStreams of a trio that keeps ``name`` under another name."""

    def make(*args: Any, **kw: Any) -> trio.SSLStream[Any]:
        stream = trio.SSLStream(*args, **kw)
        setattr(stream, name + "_renamed", getattr(stream, name))
        delattr(stream, name)
        return stream

    return make


@pytest.mark.parametrize("name", ["_incoming", "_ssl_object"])
def test_a_trio_without_the_tls_internals_is_refused_naming_its_version(name: str) -> None:
    check_trio_tls()  # this trio has them
    refused = rf"^trio {trio.__version__} is not supported .*{name}"
    with pytest.raises(ImportError, match=refused):
        check_trio_tls(_without(name))


def test_the_check_runs_when_the_driver_is_imported() -> None:
    """A fresh interpreter whose trio lost ``_incoming`` cannot import the driver: the error
    names trio's version (no HTTPS call refused one by one, silently)."""
    code = (
        "import trio\n"
        "init = trio.SSLStream.__init__\n"
        "def renamed(self, *a, **kw):\n"
        "    init(self, *a, **kw)\n"
        "    del self._incoming\n"
        "trio.SSLStream.__init__ = renamed\n"
        "import affidavit.adapters.http\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode != 0
    assert f"ImportError: trio {trio.__version__} is not supported" in proc.stderr


async def test_a_tls_stream_that_cannot_be_inspected_counts_as_holding_an_answer(
    client: HttpClient, tls: TlsFixture
) -> None:
    """trio's incoming BIO gone after the import (an attribute deleted at the check): the
    connection is refused unwritten rather than maybe lied to."""
    peer = RecordPeer(server_context(tls, V13), tickets_only)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    fe = FakeEngine()
    original = Connection.unread_bytes

    async def hidden(self: Connection, connect_timeout: float) -> bool:
        assert isinstance(self.stream, trio.SSLStream)
        del self.stream._incoming
        return await original(self, connect_timeout)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Connection, "unread_bytes", hidden)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.serve, listeners[0])
            url = f"https://127.0.0.1:{port}/pay"
            with trio.fail_after(10), pytest.raises(SetupError) as info:
                await client.perform(req(url, "POST", b"x", ca_file=tls.ca_file), fe.ctx)
            await client.aclose()
    await listeners[0].aclose()
    assert info.value.stage == "peer_spoke_first" and peer.after_handshake == 0
