"""A connection-setup error names the config field to fix only when a target setting that can
never work is its cause -- and then as the key, never the value.

Seed, "Validation and credential injection finish before dispatch": a stable code "along with
the path to the field that the caller can fix".  A CA file the config loaded but that no longer
loads (deleted, or not PEM) fails every call the same way until the operator fixes
``targets.<name>.ca_file``: ``CERTIFICATE_INVALID`` with ``field``.  A server's certificate the
CA does not vouch for is the remote's (or an attacker's) doing: the same code, no field.  The
file's path is the operator's; the (hostile) caller sees only the key.  Through the embedded
broker and through the daemon's socket, against a real TLS server on loopback.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.adapters.http.trust as http_trust
from affidavit.statemachine import EventKind as E
from tests.daemon.kit import api_target, cli, running_daemon
from tests.http.hostile import HostileServer, Reply, make_tls, scripts

from .helpers import assert_error, http_target, open_broker, write_config
from .http_rows import IDEM, POST

LIMIT = 30
GET = {"target": "api", "method": "GET", "path": "/x"}
FIELD = "targets.api.ca_file"


def _spoil(ca_file: str) -> None:
    """The operator's CA file after the config was loaded: still a file, not a certificate."""
    Path(ca_file).write_text("not a certificate\n", encoding="utf-8")


def _setup_refused(env: dict[str, Any], ca_file: str, srv: HostileServer) -> None:
    error = env["error"]
    assert (error["phase"], error["outcome"], error["retry"], error["code"]) == (
        "connection_setup",
        "not_attempted",
        "after_correction",
        "CERTIFICATE_INVALID",
    ), error
    assert error["field"] == FIELD, error
    assert error["message"] == f"CA file unusable: fix {FIELD}; nothing was sent.", error
    assert ca_file not in json.dumps(env) and "test-ca" not in json.dumps(env)
    assert env["evidence"]["dispatch_started"] is False
    # Stopped at the CA file, after DNS and before the TCP connect: no handshake was made.
    assert [a["stage"] for a in env["evidence"]["attempts"]] == ["ca_file"], env
    assert env["evidence"]["http"]["stage"] == "ca_file", env
    assert srv.requests == []


def _setup_refused_rows(broker: Any, iid: str) -> None:
    """The journal's rows say the stage the envelope says (``ca_file``), never
    ``tls_handshake``."""
    rows = broker.events(iid)
    [failed] = [e for e in rows if e.kind is E.SETUP_FAILED]
    [observed] = [e for e in rows if e.kind is E.PROTOCOL_OBSERVED]
    assert failed.attrs["stage"] == observed.attrs["facts"]["stage"] == "ca_file", rows


async def test_an_unusable_ca_file_names_its_config_field_embedded(
    tmp_path: Path, token: str
) -> None:
    tls = make_tls(tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, ca_file=tls.ca_file)})
        async with open_broker(cfg) as broker:
            _spoil(tls.ca_file)
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            rec = assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="after_correction",
                code="CERTIFICATE_INVALID",
            )
            assert rec.field == FIELD
            _setup_refused(env, tls.ca_file, srv)
            _setup_refused_rows(broker, env["invocation_id"])
            assert srv.connections == 0  # refused before the TCP connect: no TLS either


async def test_a_certificate_the_ca_does_not_vouch_for_names_no_field(
    tmp_path: Path, token: str
) -> None:
    tls = make_tls(tmp_path)
    async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.wrong_host) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url, ca_file=tls.ca_file)})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                env = await broker.call(GET)
            rec = assert_error(
                broker,
                env,
                phase="connection_setup",
                outcome="not_attempted",
                retry="after_correction",
                code="CERTIFICATE_INVALID",
            )
            # The remote presented it: no setting of ours is shown to be wrong.
            assert "field" not in env["error"] and rec.field is None
            assert srv.requests == []


async def test_an_unusable_ca_file_names_its_config_field_through_the_daemon(
    tmp_path: Path, token: str
) -> None:
    tls = make_tls(tmp_path)
    async with (
        HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv,
        running_daemon(tmp_path, api_target(srv.url, ca_file=tls.ca_file), token=token) as d,
    ):
        _spoil(tls.ca_file)
        done = await cli(d, "call", "-", stdin=json.dumps(GET).encode())
        env = json.loads(done.stdout)
        _setup_refused(env, tls.ca_file, srv)
        record = await cli(d, "record", env["invocation_id"], "--json")
        assert json.loads(record.stdout)["record"]["field"] == FIELD, record.stdout
        # The record view (its events' attrs too) names the key, never the file's path.
        assert tls.ca_file.encode() not in record.stdout, record.stdout


async def test_a_retry_stopped_by_an_unusable_ca_file_does_not_say_nothing_was_sent(
    tmp_path: Path, token: str
) -> None:
    """The first attempt was sent and its outcome is unknown; the caller's same-key retry,
    after the broker restarted, finds the CA file unusable.  The envelope stays unknown (the
    first request may have taken effect), and its message must not claim "nothing was sent":
    only the retry sent nothing."""
    action = {**POST, "idempotency_key": "pay-key-ca"}
    tls = make_tls(tmp_path)
    async with HostileServer.running(scripts.apply_then_close(), tls=tls.good) as srv:
        target = http_target(srv.url, ca_file=tls.ca_file, idempotency=IDEM)
        cfg = write_config(tmp_path, {"api": target})
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                first = await broker.call(action)
            assert first["error"]["outcome"] == "unknown", first
            assert len(srv.requests) == 1
        # The broker restarted (a process loads the CA file at its first TLS connection).
        _spoil(tls.ca_file)
        async with open_broker(cfg) as broker:
            with trio.fail_after(LIMIT):
                second = await broker.call(action)
    assert second["invocation_id"] == first["invocation_id"]
    error = second["error"]
    assert (error["code"], error["outcome"], error["field"]) == (
        "CERTIFICATE_INVALID",
        "unknown",
        FIELD,
    ), error
    assert second["evidence"]["dispatch_started"] is True, second["evidence"]
    assert error["message"] == f"CA file unusable: fix {FIELD}; this retry sent nothing.", error
    assert len(srv.requests) == 1  # the retry sent nothing
    assert tls.ca_file not in json.dumps(second)


async def test_a_ca_file_read_that_hangs_is_a_connect_timeout_at_stage_ca_file(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CA file's read is connection setup, bounded by the target's connect timeout as DNS
    and the TCP connect are: a read hung on a network mount ends the attempt ``CONNECT_TIMEOUT``
    (connection_setup, not_attempted, nothing sent) at stage ``ca_file`` after ``connect``
    seconds -- each setup try -- not at the call's deadline (``total``)."""
    tls = make_tls(tmp_path)
    release = threading.Event()
    real = http_trust.read_regular

    def hanging(path: Any, *args: Any) -> Any:
        if str(path) == tls.ca_file:
            release.wait(LIMIT)
        return real(path, *args)

    monkeypatch.setattr(http_trust, "read_regular", hanging)
    try:
        async with HostileServer.running(scripts.serve(Reply(200)), tls=tls.good) as srv:
            timeout = {"connect": 0.3, "total": 8}
            target = http_target(srv.url, ca_file=tls.ca_file, timeout=timeout)
            cfg = write_config(tmp_path, {"api": target})
            async with open_broker(cfg) as broker:
                began = trio.current_time()
                with trio.fail_after(LIMIT):
                    env = await broker.call(GET)
                took = trio.current_time() - began
                rows = broker.events(env["invocation_id"])
            assert srv.connections == 0
    finally:
        release.set()
    error = env["error"]
    assert (error["phase"], error["outcome"], error["code"]) == (
        "connection_setup",
        "not_attempted",
        "CONNECT_TIMEOUT",
    ), error
    assert took < 5, f"the call waited {took:.1f} s on the CA file, past its connect timeout"
    assert env["evidence"]["http"]["stage"] == "ca_file", env
    assert {a["stage"] for a in env["evidence"]["attempts"]} == {"ca_file"}, env
    [failed] = [e for e in rows if e.kind is E.SETUP_FAILED]
    assert failed.attrs["stage"] == "ca_file", rows
    assert tls.ca_file not in json.dumps(env)
