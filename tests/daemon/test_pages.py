"""A client puts a stored result's pages back together (``affidavit/api/pages.py``) without
trusting the daemon that answers them: each rule a hostile (or broken) daemon could break is
refused -- ``ValueError`` to ``read_pages``'s caller, ``ANSWER_LOST`` on the command line --
never an endless loop, a stream silently left empty, or bytes that are not the stored ones; a
503 with ``Retry-After`` is asked again a bounded number of times."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import trio

from affidavit.api import pages
from affidavit.api.client import Client
from affidavit.api.pages import merge_pages, read_pages
from affidavit.api.wire import RESULT_CHUNK_BYTES, ApiError
from affidavit.cli import main
from affidavit.engine import RESULT_CHUNK

CH = RESULT_CHUNK_BYTES
TEXT = b"a" * (CH - 1) + "\u00e9".encode() + b"z" * (3 * CH)
"""Five chunks of text, the first two base64 (their boundary cuts a character), the rest not."""
BINARY = bytes(range(256)) * (CH // 128)  # two chunks that are no UTF-8


def _chunks(data: bytes) -> int:
    return -(-len(data) // CH)


def page_of(streams: dict[str, bytes], at: int, per: int = 1) -> dict[str, Any]:
    """The page the daemon answers at chunk ``at``, ``per`` chunks of each stream."""
    end = at + per
    result: dict[str, Any] = {"status": 200}
    for name, data in sorted(streams.items()):
        piece = data[at * CH : end * CH]
        try:
            result[name] = piece.decode("utf-8")
        except UnicodeDecodeError:
            result[f"{name}_base64"] = base64.b64encode(piece).decode("ascii")
    more = any(_chunks(d) > end for d in streams.values())
    result["sha256"] = "sha256:" + hashlib.sha256(repr(streams).encode()).hexdigest()
    result["resume"] = {
        "from_chunk": at,
        "next_chunk": end if more else None,
        "streams": {
            name: {
                "chunks": _chunks(d),
                "bytes": len(d),
                "sha256": "sha256:" + hashlib.sha256(d).hexdigest(),
            }
            for name, d in sorted(streams.items())
        },
    }
    return {"invocation_id": "act_x", "result": result}


STREAMS = {"stdout": TEXT, "stderr": BINARY}


def _honest(at: int) -> dict[str, Any]:
    return page_of(STREAMS, at)


def test_honest_pages_put_together_are_each_stream_whole() -> None:
    merged = merge_pages([_honest(at) for at in range(_chunks(TEXT))])["result"]
    assert merged["stdout"] == TEXT.decode() and merged["resume"]["next_chunk"] is None
    assert base64.b64decode(merged["stderr_base64"]) == BINARY
    rest = merge_pages([_honest(at) for at in range(2, _chunks(TEXT))])["result"]
    assert rest["stdout"].encode() == TEXT[2 * CH :] and rest["stderr"] == ""


def _altered(change: Callable[[dict[str, Any]], None], at: int = 1) -> list[dict[str, Any]]:
    """The honest pages from 0, page ``at`` changed by ``change`` (its ``result``)."""
    got = [_honest(n) for n in range(_chunks(TEXT))]
    change(got[at]["result"])
    return got


def _bytes(result: dict[str, Any], name: str, change: Callable[[bytes], bytes]) -> None:
    """Change stream ``name``'s bytes in a page, in the form the page holds them."""
    if name in result:
        result[name] = change(result[name].encode()).decode("latin-1")
    else:
        data = change(base64.b64decode(result[f"{name}_base64"]))
        result[f"{name}_base64"] = base64.b64encode(data).decode()


def _drop_stream(result: dict[str, Any]) -> None:
    del result["stderr_base64"]


def _one_byte_short(result: dict[str, Any]) -> None:
    _bytes(result, "stdout", lambda b: b[:-1])


def _other_result(result: dict[str, Any]) -> None:
    result["sha256"] = "sha256:" + "0" * 64


def _starts_elsewhere(result: dict[str, Any]) -> None:
    result["resume"]["from_chunk"] = 2


def _table_changed(result: dict[str, Any]) -> None:
    result["resume"]["streams"]["stdout"]["bytes"] += 1


def _same_size_other_bytes(result: dict[str, Any]) -> None:
    _bytes(result, "stdout", lambda b: b"b" + b[1:])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_drop_stream, "lacks stream 'stderr'"),
        (_one_byte_short, "stream 'stdout''s page at chunk 1 holds"),
        (_other_result, "of another stored result"),
        (_starts_elsewhere, "asked at chunk 1 starts at 2"),
        (_table_changed, "another resume.streams table"),
    ],
    ids=["missing_stream", "short_page", "other_result", "other_start", "other_table"],
)
def test_a_page_that_breaks_a_rule_is_refused_naming_it(
    change: Callable[[dict[str, Any]], None], words: str
) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        merge_pages(_altered(change))


def test_bytes_that_are_not_the_stored_ones_fail_the_hash_read_from_chunk_0() -> None:
    """The same sizes, other bytes: the resume table's hash of each stream, from chunk 0."""
    got = _altered(_same_size_other_bytes, 0)
    with pytest.raises(ValueError, match="stream 'stdout' put together has another sha256"):
        merge_pages(got)


async def test_a_daemon_naming_the_next_chunk_forever_is_refused_within_the_chunk_count() -> None:
    """Only ``next_chunk > at`` was required: a daemon answering ``at + 1`` each time drove
    ~2^63 requests, ``pages`` growing without bound.  Now the next chunk must lie within the
    largest stream's chunk count: the pages are at most that many."""
    asked: list[int] = []

    async def endless(at: int) -> dict[str, Any]:
        asked.append(at)
        await trio.sleep(0)  # a checkpoint: the old endless loop ends at the deadline
        page = page_of({"body": TEXT}, at)
        page["result"]["resume"]["next_chunk"] = at + 1
        return page

    with trio.fail_after(5), pytest.raises(ValueError, match="names chunk 5 next"):
        await read_pages(endless, 0)
    assert asked == [0, 1, 2, 3, 4]


async def test_a_page_answered_503_with_retry_after_is_asked_again_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Retry-After`` is waited out (at most ``RETRY_WAIT_MOST``), ``PAGE_RETRIES`` times; a
    503 without it, or past them, is the caller's -- the pages read before are not thrown away
    for a page declined this once."""
    monkeypatch.setattr(pages, "RETRY_WAIT_MOST", 0.01)  # a daemon's 10^9 s is not waited out
    refusals: list[int] = []

    def busy(times: int, retry_after: int | None) -> Callable[[int], Any]:
        async def fetch(at: int) -> dict[str, Any]:
            if at == 2 and len(refusals) < times:
                refusals.append(at)
                raise ApiError(503, "ANSWERS_IN_FLIGHT", "busy", None, retry_after)
            return _honest(at)

        return fetch

    with trio.fail_after(5):
        merged = await read_pages(busy(pages.PAGE_RETRIES, 10**9), 0)
        assert merged is not None and merged["result"]["stdout"] == TEXT.decode()
        assert refusals == [2] * pages.PAGE_RETRIES
        refusals.clear()
        with pytest.raises(ApiError):
            await read_pages(busy(pages.PAGE_RETRIES + 1, 0), 0)
        assert len(refusals) == pages.PAGE_RETRIES + 1
        refusals.clear()
        with pytest.raises(ApiError):
            await read_pages(busy(1, None), 0)
        assert refusals == [2]


def test_the_thin_client_cuts_results_in_the_journals_chunks() -> None:
    assert RESULT_CHUNK_BYTES == RESULT_CHUNK


@contextlib.contextmanager
def fake_daemon(path: Path, answer: Callable[[int], tuple[int, bytes]]) -> Iterator[None]:
    """A socket at ``path`` answering each result page request (``from_chunk``) with
    ``answer(from_chunk)``: (status, body), ``Retry-After: 0`` on a 503; one per connection."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head and (data := conn.recv(65536)):
                    head += data
                query = parse_qs(urlsplit(head.split(b" ")[1].decode()).query)
                status, body = answer(int(query["from_chunk"][0]))
                extra = b"retry-after: 0\r\n" if status == 503 else b""
                conn.sendall(
                    b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                    b"%sconnection: close\r\n\r\n%s" % (status, len(body), extra, body)
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        server.close()


def test_the_command_line_says_pages_that_do_not_fit_together_answer_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``affidavit result ID --from-chunk 0 --socket S`` against a daemon whose second page
    lacks a stream: exit 2, ``ANSWER_LOST`` ("ask again") -- never the stream half empty."""
    sock = tmp_path / "d.sock"
    bad = _altered(_drop_stream)

    def answer(at: int) -> tuple[int, bytes]:
        return 200, json.dumps(bad[at]).encode()

    with fake_daemon(sock, answer):
        code = main(["result", "act_x", "--from-chunk", "0", "--socket", str(sock)])
    err = capsys.readouterr().err
    assert code == 2 and "ANSWER_LOST" in err and "lacks stream 'stderr'" in err, err


async def test_the_client_reads_the_retry_after_of_a_503_and_asks_again(tmp_path: Path) -> None:
    """``Client.fetch_result(from_chunk=0)`` and the command line: a page answered 503 with
    ``Retry-After`` once, then whole -- both read the header and put the result together."""
    sock = tmp_path / "d.sock"
    refused: list[int] = []

    def answer(at: int) -> tuple[int, bytes]:
        if at == 1 and len(refused) % 2 == 0:
            refused.append(at)
            error = {"api_error": {"code": "ANSWERS_IN_FLIGHT", "message": "busy"}}
            return 503, json.dumps(error).encode()
        refused.append(-1) if at == 1 else None
        return 200, json.dumps(_honest(at)).encode()

    with fake_daemon(sock, answer), trio.fail_after(10):
        async with Client.open(sock) as client:
            merged = await client.fetch_result("act_x", from_chunk=0)
        code = await trio.to_thread.run_sync(
            main, ["result", "act_x", "--from-chunk", "0", "--socket", str(sock)]
        )
    assert merged is not None and merged["result"]["stdout"] == TEXT.decode()
    assert refused == [1, -1, 1, -1] and code == 0
