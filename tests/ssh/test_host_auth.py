"""Host authentication against a server that holds several host keys (scripted, loopback).

The broker compares the presented key with its pins itself; the transport must therefore ask for
a key of a pinned type, or a legitimate server presents another of its keys and is refused."""

from __future__ import annotations

from collections.abc import Iterator

import asyncssh
import pytest
import trio

from affidavit.adapters.base import SetupError
from affidavit.adapters.ssh import SshTarget, SshTimeouts, perform, prepare_credential
from affidavit.statemachine import Code, Outcome

from .conftest import Recorder, SshKeys
from .hostile import HostileServer

_TYPES = ("ecdsa-sha2-nistp256", "ssh-rsa")


@pytest.fixture(scope="module")
def many_keys() -> Iterator[HostileServer]:
    srv = HostileServer(extra_host_keys=_TYPES).start()
    try:
        yield srv
    finally:
        srv.stop()


def _target(srv: HostileServer, pins: tuple[str, ...]) -> SshTarget:
    return SshTarget("127.0.0.1", srv.port, "bob", pins, SshTimeouts(connect=5, auth=5, exec=5))


@pytest.mark.parametrize("index", [0, 1, 2], ids=["ed25519", "ecdsa", "rsa"])
async def test_a_pinned_key_that_is_not_the_servers_first_choice_is_accepted(
    many_keys: HostileServer, ssh_keys: SshKeys, index: int
) -> None:
    rec = Recorder()
    pin = many_keys.pins[index]
    with trio.fail_after(10):
        res = await perform(
            _target(many_keys, (pin,)),
            prepare_credential(ssh_keys.client_key),
            "exit 0",
            None,
            rec.ctx,
        )
    assert (res.outcome, res.code) == (Outcome.COMMITTED, None)
    assert res.facts["host_key"].split()[0] == pin.split()[0]


async def test_a_server_without_a_key_of_any_pinned_type_is_a_host_key_mismatch(
    hostile: HostileServer, ssh_keys: SshKeys
) -> None:
    # The ed25519-only server cannot present the (foreign) ECDSA key pinned here: refused
    # before authentication, nothing requested.
    foreign = asyncssh.generate_private_key("ecdsa-sha2-nistp256")
    pin = " ".join(foreign.export_public_key("openssh").decode().split()[:2])
    rec = Recorder()
    before = len(hostile.exec_requests)
    with trio.fail_after(10), pytest.raises(SetupError) as ei:
        await perform(
            _target(hostile, (pin,)),
            prepare_credential(ssh_keys.client_key),
            "exit 0",
            None,
            rec.ctx,
        )
    assert ei.value.code == Code.HOST_KEY_MISMATCH, str(ei.value)
    assert "authenticated" not in rec.events and rec.ctx.machine.state == "setup_failed"
    assert len(hostile.exec_requests) == before


def test_only_libssh_words_say_no_pinned_key_type() -> None:
    # The name lists in the message are the server's: a cipher list that holds the phrase is
    # still a handshake failure, not a host key refusal.
    from affidavit.adapters.ssh.connect import no_pinned_key_type

    assert no_pinned_key_type(
        "SSHError: kex error : no match for method server host key algo: server [ssh-ed25519],"
        " client [ecdsa-sha2-nistp256]"
    )
    assert not no_pinned_key_type(
        "SSHError: kex error : no match for method encryption client->server: server"
        " [no match for method server host key algo], client [aes256-gcm@openssh.com]"
    )
