"""The thin client (``affidavit ... --socket``) fuzzed with hostile arguments: ids holding
``/``, ``?``, ``%``, ``..``, non-UTF-8 bytes (argv hands them over as lone surrogates), odd
times, limits and chunks, any action text.  Whatever the caller gives, the command exits 0, 1 or
2, never with a traceback, prints the daemon's words or an envelope, and nothing it prints holds
the canary credential; a command the daemon refuses journals nothing.

In-process runs of ``affidavit.cli.main`` against one real daemon (``fuzz_daemon``); an
interpreter per example would take minutes.  Bounded by ``max_examples``.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import affidavit.cli

from .fuzzkit import CANARY, Daemon, fuzz_daemon

IID = "{IID}"
"""Stands for the id of a real invocation (``made``): a hostile id is most telling beside it."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str]]:
    with fuzz_daemon(tmp_path_factory.mktemp("clifuzz")) as d:
        action = b'{"target":"api","method":"GET","path":"/made"}'
        code, out, _ = _main(["call", "-", "--socket", str(d.socket)], action)
        assert code == 0, out
        yield d, json.loads(out)["invocation_id"]


def _main(args: list[str], stdin: bytes = b"") -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code: object = affidavit.cli.main(args)
            except SystemExit as exc:  # argparse's --help; ``main`` returns every refusal's
                # status.  Taken as it is: a code that is no exit status (an ``ArgvRefused``
                # whose stable code shadowed it exits 1, printing only the code) fails the
                # caller's ``code in (0, 1, 2)``.
                code = exc.code
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


_NEAR_REAL = st.sampled_from(["/result", "/reconcile", "", "/", "%2Fresult", "?x=1", "/../x"]).map(
    lambda tail: IID + tail
)
_TEXT = st.one_of(
    _NEAR_REAL,  # the real id and a tail: what could pass for another route
    st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=30),
    st.sampled_from(
        ["x/result", "x/reconcile", "../../v1/calls", "x?from_chunk=1", "x#y", "%2F", "%", "..",
         ".", "/", "\udcff\udcfe", "act_" + "0" * 26, "x" * 5000, " ", "-", "--json", "a\r\nb"]
    ),
)  # fmt: skip
_NUMBER = st.sampled_from(["-1", "0", "1", "1e999", "nan", "inf", "9" * 400, "0x10", "1.5", "²"])
_TIME = st.sampled_from(["nan", "1e999", "-1e308", "2026-13-45", "yesterday", "0", "9" * 40])


def _opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.just([]) | values.map(lambda v: [flag, v])


_COMMANDS = st.one_of(
    st.builds(lambda i, c: ["result", i, *c], _TEXT, _opt("--from-chunk", _NUMBER | _TEXT)),
    st.builds(lambda i, j: ["record", i, *j], _TEXT, st.sampled_from([[], ["--json"]])),
    st.builds(
        lambda s, t, u, j: ["actions", *s, *t, *u, *j],
        _opt("--session", _TEXT),
        _opt("--since", _TIME | _TEXT),
        _opt("--until", _TIME),
        st.sampled_from([[], ["--json"]]),
    ),
    st.builds(lambda j: ["sessions", *j], st.sampled_from([[], ["--json"]])),
    st.builds(
        lambda s, t, p: ["metrics", *s, *t, *p],
        _opt("--session", _TEXT),
        _opt("--since", _TIME),
        st.sampled_from([[], ["--json"], ["--prometheus"]]),
    ),
    st.builds(
        lambda v, i, j: ["approvals", *j, v, i],
        st.sampled_from(["show", "approve", "deny"]),
        _TEXT,
        st.sampled_from([[], ["--json"]]),
    ),
    st.builds(
        lambda i, how, n: ["reconcile", i, *how, *n],
        _TEXT,
        st.sampled_from([["--query"], ["--attest", "committed"], ["--attest", "rejected"]]),
        _opt("--note", _TEXT),
    ),
    st.builds(lambda t: ["call", "-", *t], _opt("--timeout", _NUMBER)),
    st.just(["console-url", "--json"]),
)
_STDIN = st.one_of(
    st.binary(max_size=60),
    st.sampled_from(
        [b'{"target":"api","method":"GET","path":"/x"}', b'{"target":"api","target":"x"}',
         b'{"target":NaN}', b"[" * 50_000 + b"]" * 50_000, b'{"target":"\\ud800"}', b""]
    ),
)  # fmt: skip


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(command=_COMMANDS, stdin=_STDIN)
def test_any_thin_client_command_exits_with_words_never_a_traceback(
    served: tuple[Daemon, str], command: list[str], stdin: bytes
) -> None:
    daemon, iid = served
    command = [a.replace(IID, iid) for a in command]
    before = daemon.events()
    code, out, err = _main([*command, "--socket", str(daemon.socket)], stdin)
    assert code in (0, 1, 2), (command, code, err)
    assert "Traceback" not in err + out
    assert CANARY not in err + out
    if code == 2 or command[0] != "call":
        # A usage error, a read, or an operator's act on no such record: nothing journaled.
        assert daemon.events() == before, (command, code, out[:300], err[:300])
    if command[0] == "call" and code != 2:
        envelope = json.loads(out)
        assert "error" in envelope or "result" in envelope, envelope
    daemon.alive()
    daemon.log_is_clean()
