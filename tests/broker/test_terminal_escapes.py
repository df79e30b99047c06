"""What an agent or a remote chose never drives the operator's terminal (docs/approvals.md,
"What the terminal shows").

The command line is run as the operator runs it, a real subprocess, with hostile strings where a
caller or a remote puts them: an invocation id the operator pastes as an argument, a target name
in the config, an SSH command and stdin and an HTTP body waiting for approval, a remote's response
headers and body shown by ``affidavit result``.  No raw ESC, BEL, DEL, C1 control or bidi
override reaches stdout or stderr; each is there as its escape (``\\u001b``, ``\\u202e``).
JSON output stays JSON, holding the very value.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.approvals import OperatorError
from affidavit.approvals.service import MAX_NOTE, check_note
from affidavit.daemon.http import named as named_field
from affidavit.text import INVISIBLE, escape_char, pieces, printable, shown_as_is, utc_time
from tests.http.hostile import HostileServer, Peer

from .helpers import affidavit_cli, http_target, write_config
from .test_config import KEY_A

RAW = ("\x1b", "\x07", "\x7f", "\x9b", "\u202e", "\u2066", "\u2028", "\r")
"""Characters that must never reach the terminal as themselves."""

HOSTILE = "x\x1b[2J\x1b]0;owned\x07\u202eevil\u2066\x7f\x9b\r"


def _clean(*outputs: bytes) -> str:
    """All of ``outputs`` as text, checked to hold no raw control or bidi character."""
    text = b"".join(outputs).decode("utf-8")
    for c in RAW:
        assert c not in text, (c, text[-800:])
    return text


def _init(tmp_path: Path) -> str:
    cfg = tmp_path / "affidavit.toml"
    done = subprocess.run(
        [sys.executable, "-m", "affidavit", "init", "--config", str(cfg)],
        capture_output=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return str(cfg)


def test_the_rule_escapes_controls_and_bidi_and_keeps_letters() -> None:
    assert printable("plain é ü 中 ok") == "plain é ü 中 ok"
    assert printable("a\x1b[31mb\u202ec\x07\x7f\x9b") == (
        "a\\u001b[31mb\\u202ec\\u0007\\u007f\\u009b"
    )
    assert printable("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert printable("one\ntwo\tthree\r", keep="\n\t") == "one\ntwo\tthree\\r"
    assert escape_char("\U000e0001") == "\\U000e0001"
    # Every escape is a JSON escape (but \U): one that lands in a JSON string reads back.
    assert json.loads('"' + printable("\x1b\u202e\x7f\u2028") + '"') == "\x1b\u202e\x7f\u2028"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param("cafe\u0301 ve\u0323\u0302t", "cafe\u0301 ve\u0323\u0302t", id="two_kept"),
        pytest.param("0\u0338", "0\\u0338", id="overlay_slash_looks_like_a_letter"),
        pytest.param("=\u0338", "=\\u0338", id="overlay_looks_like_not_equal"),
        pytest.param("a\u20d2b", "a\\u20d2b", id="overlay_long_vertical_line"),
        pytest.param("1\u20dd", "1\\u20dd", id="enclosing_circle"),
        pytest.param("x\u0489", "x\\u0489", id="enclosing_millions_sign"),
        pytest.param("e\u0301\u0302\u0303\u0304", "e\u0301\u0302\\u0303\\u0304", id="a_stack"),
        pytest.param("\x1b\u0301", "\\u001b\\u0301", id="a_mark_after_an_escape"),
    ],
)
def test_a_combining_mark_that_changes_a_letter_or_stacks_is_shown_escaped(
    text: str, shown: str
) -> None:
    # An agent's "0" with U+0338 reads as a slashed zero, "=" with it as "not equal", and a
    # stack of hundreds of marks paints over the lines above: on the terminal and the card.
    assert printable(text) == shown
    assert shown_as_is(text) is (text == shown)
    zalgo = "a" + "\u0301" * 500
    assert printable(zalgo) == "a\u0301\u0301" + "\\u0301" * 498


DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x061C, 0x061C),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
"""Default_Ignorable_Code_Point, Unicode 14.0 (DerivedCoreProperties.txt; Perl 5.36's
``Unicode::UCD::prop_invlist`` gives the same ranges), unchanged through 16.0."""

CHECKED_UNICODE = ("14.0.0", "15.0.0", "15.1.0", "16.0.0")
"""Unicode versions whose Default_Ignorable_Code_Point ``DEFAULT_IGNORABLE`` is."""


def test_the_unicode_version_is_one_the_invisible_table_was_checked_against() -> None:
    assert unicodedata.unidata_version in CHECKED_UNICODE, (
        f"this Python's Unicode is {unicodedata.unidata_version}: compare DEFAULT_IGNORABLE "
        "(and affidavit.text.INVISIBLE) with that version's DerivedCoreProperties.txt, then add "
        "the version to CHECKED_UNICODE"
    )


def test_every_default_ignorable_and_every_space_but_u0020_is_shown_escaped() -> None:
    ignorable = {chr(c) for lo, hi in DEFAULT_IGNORABLE for c in range(lo, hi + 1)}
    spaces = {c for c in map(chr, range(0x110000)) if unicodedata.category(c) == "Zs"} - {" "}
    for c in sorted(ignorable | spaces | {"\u2800", "\U00016fe4", "\U0001d159"}):
        assert printable(f"a{c}b") == f"a{escape_char(c)}b", hex(ord(c))
        assert not shown_as_is(c), hex(ord(c))
    # What INVISIBLE adds to the categories escaped is exactly those, named and pinned here.
    beyond = {c for c in ignorable if unicodedata.category(c)[0] != "C"}
    assert beyond | spaces | {"\u2800", "\U00016fe4", "\U0001d159"} == INVISIBLE
    # The audit's case: a key that differs by an invisible mark looks different.
    assert printable('{"dry_run\u034f": true}') == '{"dry_run\\u034f": true}'
    assert printable("visible spacing\u3000\u2003") == "visible spacing\\u3000\\u2003"
    # An answer names a field only when it shows as itself (else the place it is in).
    assert named_field("dry_run\u034f", "body") == "body"
    assert named_field("dry_run", "body") == "dry_run"


def test_the_fast_check_agrees_with_the_rule_for_every_code_point() -> None:
    # Each code point after a letter of its own, as it would stand in a name.
    everything = "".join(map(chr, range(0x110000)))
    escaped = {c for c, marked in pieces("a" + "a".join(everything)) if marked}
    assert escaped == {c for c in everything if not shown_as_is("a" + c)}
    assert "a" not in escaped and "\u00e9" not in escaped and "\u4e2d" not in escaped


def test_a_note_is_refused_for_what_is_wrong_with_it() -> None:
    assert check_note("ok\tchecked with finance é") == "ok\tchecked with finance é"
    # The spaces typed text holds (macOS Option+Space, French typing, pasted text) are kept as
    # typed: an attestation needs a note, and the operator cannot see them to take them out.
    for typed in ("vérifié\u00a0: ok", "10\u202f000 € ok", "ok\u3000done"):
        assert check_note(typed, required=True) == typed
        assert "\\u" in printable(typed)  # and shown escaped wherever it is read
    for bad, shown in (
        ("ok\x1b[2J", "\\u001b"),
        ("a\nb", "\\n"),
        ("x\u202e", "\\u202e"),
        ("ok\u034f", "\\u034f"),
        ("ok\u200b", "\\u200b"),
        ("ok\u2800", "\\u2800"),
        ("ok\u2028", "\\u2028"),
        ("ok\ue000", "\\ue000"),
        ("0\u0338", "\\u0338"),
    ):
        with pytest.raises(OperatorError) as info:
            check_note(bad)
        assert (info.value.code, info.value.field, info.value.status) == ("BAD_NOTE", "note", 400)
        assert f"note: holds a character shown as an escape ({shown})" in info.value.message
    with pytest.raises(OperatorError) as info:
        check_note("x" * (MAX_NOTE + 1))
    assert (info.value.code, info.value.field, info.value.status) == ("BAD_NOTE", "note", 400)
    assert f"at most {MAX_NOTE} characters (this one has {MAX_NOTE + 1})" in info.value.message
    assert check_note(" \t", required=False) is None
    for blank in (None, "", " \t", "\u00a0\u202f"):
        with pytest.raises(OperatorError) as info:
            check_note(blank, required=True)
        assert (info.value.code, info.value.field, info.value.status) == (
            "NOTE_REQUIRED",
            "note",
            400,
        )


async def test_an_invocation_id_argument_is_echoed_escaped(tmp_path: Path) -> None:
    cfg = _init(tmp_path)
    iid = "act_\x1b[31mred\u202e\x07"
    for args in (
        ("record", iid, "--config", cfg),
        ("result", iid, "--config", cfg),
        ("approvals", "show", iid, "--config", cfg),
        ("record", "x", "--no-such-option", iid),  # argparse's own error echoes it
    ):
        done = await affidavit_cli(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        err = _clean(done.stdout, done.stderr)
        assert "act_\\u001b[31mred\\u202e\\u0007" in err, (args, err)
    # A line feed in it is not a line of its own: the message stays one line.
    fake = await affidavit_cli("record", "act_x\naffidavit: approved", "--config", cfg)
    assert fake.returncode == 2 and fake.stderr.count(b"\n") == 1, fake.stderr
    assert b"act_x\\naffidavit: approved" in fake.stderr


async def test_a_target_name_in_the_config_is_shown_escaped(tmp_path: Path) -> None:
    for name in ("e\\u0007 x", "a\\u202eb", "c\\u001b[2Jd"):
        cfg = tmp_path / "affidavit.toml"
        cfg.write_text(f'[targets."{name}"]\nkind = "http"\n')
        done = await affidavit_cli("approvals", "--config", str(cfg))
        assert done.returncode == 2, done.stderr
        err = _clean(done.stdout, done.stderr)
        assert f"targets.{name}" in err, err


def _pending_config(tmp_path: Path) -> str:
    ssh = {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": 9,  # never reached: the command waits for an operator
        "user": "deploy",
        "host_key": KEY_A,
        "credential": "env:TERMINAL_TEST_KEY",
        "approval": {"commands": [".*"], "wait": "0s"},
    }
    http = http_target("http://127.0.0.1:9", approval={"methods": ["POST"], "wait": "0s"})
    path = write_config(tmp_path, {"box": ssh, "api": http})
    with path.open("a") as f:
        f.write(f"[service]\noperator_uids = [{os.getuid()}]\nallow_self_approval = true\n")
    return str(path)


async def _ask(cfg: str, action: dict[str, Any]) -> str:
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-m", "affidavit", "call", "-", "--config", cfg],
            stdin=json.dumps(action).encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env={**os.environ, "TERMINAL_TEST_KEY": _private_key()},
        )
    envelope = json.loads(done.stdout)
    assert envelope["error"]["code"] == "APPROVAL_PENDING", envelope
    return str(envelope["invocation_id"])


async def test_a_pending_request_is_listed_and_shown_escaped(tmp_path: Path, token: str) -> None:
    cfg = _pending_config(tmp_path)
    command = "echo \x1b[2J\u202e hs.live lruc\x07 #\u2066"
    ssh_id = await _ask(cfg, {"target": "box", "command": command, "stdin": HOSTILE})
    http_id = await _ask(
        cfg, {"target": "api", "method": "POST", "path": "/v1/charges", "body": HOSTILE}
    )

    listed = await affidavit_cli("approvals", "--config", cfg)
    assert listed.returncode == 0, listed.stderr
    table = _clean(listed.stdout, listed.stderr)
    assert "echo \\u001b[2J\\u202e hs.live lruc\\u0007 #\\u2066" in table
    assert ssh_id in table and http_id in table

    for iid, field in ((ssh_id, "stdin"), (http_id, "body")):
        shown = await affidavit_cli("approvals", "show", iid, "--config", cfg)
        assert shown.returncode == 0, shown.stderr
        _clean(shown.stdout, shown.stderr)
        assert b"\\u001b[2J" in shown.stdout and b"\\u202e" in shown.stdout
        assert json.loads(shown.stdout)["request"][field] == HOSTILE, shown.stdout

    as_json = await affidavit_cli("approvals", "--json", "--config", cfg)
    rows = json.loads(_clean(as_json.stdout))
    assert command in [r["request"].get("command") for r in rows]

    # An operator's note with a control character is refused for that reason.
    noted = await affidavit_cli(
        "approvals", "approve", ssh_id, "--note", "ok\x1b[2J", "--config", cfg
    )
    assert noted.returncode == 2
    err = _clean(noted.stderr)
    assert "shown as an escape (\\u001b)" in err and "one line of at most" not in err, err


async def test_a_remote_s_headers_and_body_in_result_are_escaped(
    tmp_path: Path, token: str
) -> None:
    body = HOSTILE.encode() + b"\xe2\x80\xa8"
    header = b"v\x1b[2J\x1b]0;t\x07\xe2\x80\xae\xc2\x9b"

    async def script(peer: Peer) -> None:
        await peer.read_request()
        await peer.send_raw(
            b"HTTP/1.1 200 OK\r\nX-Evil: " + header + b"\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        await peer.close()

    async with HostileServer.running(script) as srv:
        cfg = str(write_config(tmp_path, {"api": http_target(srv.url)}))
        action = tmp_path / "get.json"
        action.write_text(json.dumps({"target": "api", "method": "GET", "path": "/x"}))
        called = await affidavit_cli("call", str(action), "--config", cfg)
    assert called.returncode == 0, called.stderr
    _clean(called.stdout, called.stderr)
    iid = json.loads(called.stdout)["invocation_id"]

    shown = await affidavit_cli("result", iid, "--config", cfg)
    assert shown.returncode == 0, shown.stderr
    _clean(shown.stdout, shown.stderr)
    result = json.loads(shown.stdout)["result"]
    assert result["body"] == body.decode()  # the very value, escaped only on the wire
    assert b"\\u001b[2J" in shown.stdout and b"\\u007f" in shown.stdout
    assert b"\\u2028" in shown.stdout and b"\\u009b" in shown.stdout
    [evil] = [v for k, v in result["headers"] if k.lower() == "x-evil"]
    assert "\x1b[2J" in evil

    record = await affidavit_cli("record", iid, "--config", cfg)
    assert record.returncode == 0, record.stderr
    _clean(record.stdout, record.stderr)

    # --raw is the remote's bytes, exactly: to a file or a pipe, never to a terminal.
    piped = await affidavit_cli("result", iid, "--raw", "--config", cfg)
    assert piped.returncode == 0 and piped.stdout == body
    main, tty = os.openpty()
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "affidavit", "result", iid, "--raw", "--config", cfg],
            stdout=tty,
            stderr=subprocess.PIPE,
            check=False,
            timeout=60,
        )
    finally:
        os.close(tty)
        os.close(main)
    assert refused.returncode == 2
    assert b"redirect it to a file or a pipe" in refused.stderr


def _private_key() -> str:
    """An OpenSSH private key: an SSH target's credential must be one (never a password)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return (
        Ed25519PrivateKey.generate()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        .decode()
    )


@pytest.mark.parametrize(
    ("at", "shown"),
    [
        (0, "1970-01-01 00:00:00"),
        (1.5e9, "2017-07-14 02:40:00"),
        (float("inf"), "inf (not a time)"),
        (float("-inf"), "-inf (not a time)"),
        (float("nan"), "nan (not a time)"),
        (1e300, "1e+300 (not a time)"),
        (None, "-"),
        (True, "-"),
        ("1970", "-"),
    ],
)
def test_a_row_s_time_is_shown_whatever_it_holds(at: object, shown: str) -> None:
    """A journal row's ``at`` altered to a value no clock shows is shown as itself, marked --
    never an OverflowError out of the CLI's record or the console's page."""
    assert utc_time(at, "%Y-%m-%d %H:%M:%S") == shown
