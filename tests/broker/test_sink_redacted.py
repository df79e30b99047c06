"""Which streams echoed a secret: what the sink tells before ``finish`` (by scanning the bytes
its redactors hold back) is what it tells after (``redacted``) -- so ``delivery._commit`` asks
only after, and a committed result's sizes are withheld as they were (issue 15).  An answer
that ends without a result was cut short, so every stream holding bytes back withholds them
(``Redactor.ending``), as ``finish`` does for a stream stored cut short; a complete stream's
end is never cut, so only an echo makes it ``redacted``."""

from __future__ import annotations

import itertools
from typing import Any

import trio

from affidavit.engine.sink import StreamSink

SECRET = b"s3cret-value-1"


class _Writer:
    async def put(self, name: str, index: int, chunk: bytes, *, last: bool = False) -> None:
        pass

    async def drain(self) -> None:
        pass

    async def flush(self) -> None:
        pass


class _Journal:
    def result_writer(self, iid: str, generation: int | None) -> _Writer:
        return _Writer()


def _bodies() -> list[bytes]:
    s = SECRET
    return [
        b"",
        b"ok",
        b"x" * 100,
        s,
        b"you sent: " + s,  # the echo in the held-back tail
        s + b" and more text after it, longer than the secret",
        b"a" * 70000 + s,  # past a chunk
        b"you sent: " + s[:-1],  # a form begun at the end: cut only if the stream was
        b"you sent: " + s[:3],
        b"Bearer " + s + b"\r\n",
    ]


async def _sets(streams: dict[str, bytes], step: int, cut: bool) -> tuple[set[str], set[str]]:
    sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
    for name, data in streams.items():
        for i in range(0, len(data), step):
            await sink(name, data[i : i + step])
    before = set(sink.redacted_streams())
    done = await sink.finish(lambda name: cut)
    after = {name for name in done if sink.redacted(name)}
    assert not any(st["redactor"].pending for st in sink._streams.values())
    return before, after


def test_the_streams_told_redacted_before_finish_are_those_after() -> None:
    async def main() -> None:
        seen: list[Any] = []
        for body, other in itertools.product(_bodies(), repeat=2):
            for step in (1, 3, 7, 4096) if len(body + other) < 1000 else (4096, 65536):
                streams = {"stdout": body, "stderr": other}
                before, after = await _sets(streams, step, True)
                assert before == after, (body[-20:], other[-20:], step)
                # Every stream that received a byte: its end withheld, whatever it was.
                assert after == {name for name, data in streams.items() if data}
                _, complete = await _sets(streams, step, False)
                assert complete == {name for name, data in streams.items() if SECRET in data}
                seen.append(complete)
        assert {"stdout"} in seen and {"stdout", "stderr"} in seen and set() in seen

    trio.run(main)


def test_a_stream_cut_short_is_told_apart_from_an_echo_whatever_its_end_was() -> None:
    """``tail_redacted``: cut short, its held-back end withheld, whatever it was -- the same
    for the beginning of a form and for ordinary text; ``redacted``: a whole form -- told alike
    before ``finish`` (``withheld``, an attempt cut short) and after (``why``, a result stored
    cut short).  A complete stream that ends inside a form keeps its end (not redacted)."""

    async def told(body: bytes) -> tuple[tuple[list[str], str], str, bool]:
        sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
        await sink("body", body)
        before = sink.withheld()
        await sink.finish(lambda name: True)
        whole = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
        await whole("body", body)
        await whole.finish()
        return before, sink.why("body"), whole.redacted("body")

    async def main() -> None:
        cut = ((["body"], "tail_redacted"), "tail_redacted", False)
        assert await told(b"you sent: " + SECRET[:-1]) == cut
        assert await told(b"you sent: " + b"x" * (len(SECRET) - 1)) == cut
        echo = ((["body"], "redacted"), "redacted", True)
        assert await told(b"you sent: " + SECRET) == echo
        assert await told(b"you sent: " + SECRET + b" and " + SECRET[:-1]) == echo

    trio.run(main)


def test_a_head_that_echoed_makes_the_sinks_reason_an_echo_not_a_cut_end() -> None:
    """A header scrubbed of a whole form proves an echo: the streams' counts go as
    ``redacted`` though a stream only ended inside a form (``tail_redacted`` alone); a header
    cut inside one proves nothing more."""

    async def main(header: str) -> tuple[list[str], str]:
        sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
        await sink("body", b"you sent: " + SECRET[:-1])
        sink.scrub({"headers": [["x-seen", header]]})
        return sink.withheld()

    assert trio.run(main, "ok") == (["body"], "tail_redacted")
    assert trio.run(main, SECRET[:-2].decode()) == (["body"], "tail_redacted")
    assert trio.run(main, SECRET.hex()) == (["body"], "redacted")


def test_a_stream_cut_at_its_end_is_recorded_redacted_when_the_head_echoed() -> None:
    """``received_evidence``'s word for a stream that only ended inside a form is never weaker
    than the head's: a summary scrubbed of a whole form (SSH's, which has no driver word)
    proved an echo, so the stream's ``received_withheld`` is ``redacted``, as the record's own
    (``_commit``) -- not ``tail_redacted``, "cut short, its end withheld"."""
    from adapters.base import RemoteResult
    from affidavit.engine.delivery import received_evidence
    from affidavit.statemachine import Outcome

    async def main(header: str) -> Any:
        sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
        await sink("stdout", b"you sent: " + SECRET[:-1])
        summary = sink.scrub({"banner": header})
        await sink.finish(lambda name: True)  # stored cut short: its end withheld
        facts = {"stdout_sha256": "0" * 64}  # what the driver hashed of the stream as received
        result = RemoteResult(Outcome.COMMITTED, None, facts=facts, summary=summary)
        return received_evidence(result, sink).get("stdout_received_withheld")

    assert trio.run(main, "ok") == "tail_redacted"
    assert trio.run(main, SECRET.hex()) == "redacted"
