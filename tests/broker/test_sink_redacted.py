"""Which streams echoed a secret: what the sink tells before ``finish`` (by scanning the bytes
its redactors hold back) is what it tells after (``redacted``) -- so ``delivery._commit`` asks
only after, and a committed result's sizes are withheld as they were (issue 15)."""

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
        b"you sent: " + s[:-1],  # a form begun at the end: replaced (Redactor.flush)
        b"you sent: " + s[:3],  # too short a beginning: nothing replaced
        b"Bearer " + s + b"\r\n",
    ]


async def _sets(streams: dict[str, bytes], step: int) -> tuple[set[str], set[str]]:
    sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
    for name, data in streams.items():
        for i in range(0, len(data), step):
            await sink(name, data[i : i + step])
    before = set(sink.redacted_streams())
    done = await sink.finish()
    after = {name for name in done if sink.redacted(name)}
    assert not any(st["redactor"].pending for st in sink._streams.values())
    return before, after


def test_the_streams_told_redacted_before_finish_are_those_after() -> None:
    async def main() -> None:
        seen: list[Any] = []
        for body, other in itertools.product(_bodies(), repeat=2):
            for step in (1, 3, 7, 4096) if len(body + other) < 1000 else (4096, 65536):
                streams = {"stdout": body, "stderr": other}
                before, after = await _sets(streams, step)
                assert before == after, (body[-20:], other[-20:], step)
                seen.append(after)
        assert {"stdout"} in seen and {"stdout", "stderr"} in seen and set() in seen

    trio.run(main)


def test_a_stream_whose_end_alone_was_redacted_is_told_apart_from_an_echo() -> None:
    """``tail_redacted``: only the end, as the beginning of a form (it may be ordinary text);
    ``redacted``: a whole form -- told alike before ``finish`` (``withheld``, an attempt cut
    short) and after (``why``, a committed result)."""

    async def told(body: bytes) -> tuple[tuple[list[str], str], str]:
        sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
        await sink("body", body)
        before = sink.withheld()
        await sink.finish()
        return before, sink.why("body")

    async def main() -> None:
        assert await told(b"you sent: " + SECRET[:-1]) == (
            (["body"], "tail_redacted"),
            "tail_redacted",
        )
        assert await told(b"you sent: " + SECRET) == ((["body"], "redacted"), "redacted")
        both = b"you sent: " + SECRET + b" and " + SECRET[:-1]
        assert await told(both) == ((["body"], "redacted"), "redacted")

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
    (``_commit``) -- not ``tail_redacted``, "may be ordinary text"."""
    from adapters.base import RemoteResult
    from affidavit.engine.delivery import received_evidence
    from affidavit.statemachine import Outcome

    async def main(header: str) -> Any:
        sink = StreamSink(_Journal(), "act_1", (SECRET,), keep_limit=1 << 20)  # type: ignore[arg-type]
        await sink("stdout", b"you sent: " + SECRET[:-1])
        summary = sink.scrub({"banner": header})
        await sink.finish()
        facts = {"stdout_sha256": "0" * 64}  # what the driver hashed of the stream as received
        result = RemoteResult(Outcome.COMMITTED, None, facts=facts, summary=summary)
        return received_evidence(result, sink).get("stdout_received_withheld")

    assert trio.run(main, "ok") == "tail_redacted"
    assert trio.run(main, SECRET.hex()) == "redacted"
