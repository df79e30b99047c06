"""``affidavit actions --json`` read from the journal: one JSON array, one record per line,
written as the records are folded -- and over a large journal, folded by two processes.

The fold and the encoder are Python, on one core (issue 15: 1M events in <= 10 s).  When the
journal can be cut (``JournalReader.action_spans``: SQLite with its index of first events, no
session filter) and the machine has a second core, a child process folds the later half of the
invocations into an unnamed temporary file while this one folds and writes the first half; its
text is then copied out after them.  The child is started first and told its half on stdin once
the journal is cut, so that its start-up overlaps the cut.  Both halves read through the same
head seq, so together they are the records one read would give.  The child only saves time: if
it fails in any way (an error, a crash, killed), this process folds that half itself, so the
output, and an error part-way with every record before it written, are what one process would
give.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any

from affidavit.cli import ascii_json_stdout

if TYPE_CHECKING:
    from affidavit.journal import JournalReader

__all__ = ["SPLIT_MIN_EVENTS", "fold_span", "write_actions_json", "write_array"]

SPLIT_MIN_EVENTS = 200_000
"""Fewer events than this are folded by one process: starting a second one (an interpreter and
the broker's imports) costs more than it would save."""

_COPY = 1 << 20


class _Array:
    """A JSON array of texts, one per line, written in blocks (one ``write`` per ~500 records
    instead of one each; the output is the same)."""

    def __init__(self, opening: str = "[\n") -> None:
        self.sep = opening

    def items(self, texts: Iterable[str]) -> None:
        write = _text_writer()
        block: list[str] = []
        add = block.append
        try:
            for text in texts:
                add(self.sep)
                add(text)
                self.sep = ",\n"
                if len(block) >= 1024:
                    text = "".join(block)
                    block.clear()  # before the write: a write that fails is not made again
                    write(text)
        finally:
            # A record that fails part-way (a journal error) still leaves every record before
            # it written, as one write per record did: nothing folded is held back.
            write("".join(block))

    def joined(self, spool: IO[bytes]) -> None:
        """Items another process wrote to ``spool``, joined by ``,\\n``, copied as they are:
        as bytes to standard output's binary buffer when it has one (the text is ASCII JSON,
        the same bytes either way; decoding ~70 MB of it and encoding it again was the last
        step of a split 1M-event view, after the child had finished)."""
        spool.seek(0)
        chunk = spool.read(_COPY)
        if not chunk:
            return
        out = ascii_json_stdout()
        _text_writer()(self.sep)
        self.sep = ",\n"
        buffer = getattr(out, "buffer", None)
        if buffer is None:
            while chunk:
                out.write(chunk.decode("utf-8"))
                chunk = spool.read(_COPY)
            return
        out.flush()  # what the text layer holds goes first
        while chunk:
            _write_all(buffer, chunk)
            chunk = spool.read(_COPY)

    def close(self) -> None:
        _text_writer()("[]\n" if self.sep == "[\n" else "\n]\n")


def _text_writer() -> Callable[[str], object]:
    """What writes the view's ASCII text to standard output, whole.  Under ``python -u`` or
    ``PYTHONUNBUFFERED`` the text layer writes straight to a raw ``FileIO`` and drops what a
    short write did not take (a pipe's reader stopped and continued, ``SIGSTOP``/``SIGCONT``,
    cut the view short, exit status 0): then the text goes to the raw file through
    ``_write_all``, after what the text layer holds."""
    out = ascii_json_stdout()
    raw = getattr(out, "buffer", None)
    if not isinstance(raw, io.RawIOBase):
        return out.write  # type: ignore[no-any-return]
    out.flush()
    return lambda text: _write_all(raw, text.encode("ascii"))


def _write_all(buffer: IO[bytes] | io.RawIOBase, chunk: bytes) -> None:
    """All of ``chunk`` to ``buffer`` -- a raw ``FileIO`` under ``python -u`` or
    ``PYTHONUNBUFFERED`` (a container image's habit) may take part of it, a signal arriving
    mid-write, and says how much: the rest is written again, never dropped.  None (a
    non-blocking descriptor that is full) is an error, not a short view."""
    view = memoryview(chunk)
    while view:
        n = buffer.write(view)
        if n is None:
            raise BlockingIOError(errno.EAGAIN, "standard output is non-blocking and full")
        view = view[n:]


def write_array(texts: Iterable[str]) -> None:
    """JSON texts written as one array, one item per line."""
    out = _Array()
    out.items(texts)
    out.close()


def write_actions_json(j: JournalReader, filters: dict[str, Any]) -> None:
    """The actions view of ``j`` (``iter_actions(**filters)``) as ``--json`` prints it."""
    from affidavit.views import record_json_encoder

    encode = record_json_encoder(operator=True)
    # One clock reading for every record's retry hint, whichever process folds it: the two
    # halves of a split view answer at the same moment (docs/contract.md, "When the hint is
    # computed").  A float in the filters the child is sent; computing the hint is one call.
    # On a shared journal the database's clock, in whose time keys' retention is recorded.
    now = filters.get("now")
    filters = {**filters, "now": j.now() if now is None else now}
    if (
        filters.get("session") is not None
        or (os.cpu_count() or 1) < 2
        or j.path is None
        or j.head()[0] < SPLIT_MIN_EVENTS
    ):
        write_array(map(encode, j.iter_actions(**filters)))
        return
    with tempfile.TemporaryFile() as spool:
        # The child is started before the spans are known and waits for its own on stdin: its
        # interpreter and imports (~0.5 s) run while ``action_spans`` checks the index of
        # first events (~0.5 s over 1M events), instead of after it.
        child = _start(spool)
        try:
            spans = j.action_spans(2, SPLIT_MIN_EVENTS)
            if spans is None or len(spans) != 2:  # the journal cannot be cut: one process
                write_array(map(encode, j.iter_actions(**filters)))
                return
            mine, theirs = spans
            if child is not None and not _send(child, str(j.path), filters, theirs, j.send_windows):
                child.wait()  # it has died already: its half is folded here
                child = None
            out = _Array()
            out.items(map(encode, j.iter_actions(**filters, span=mine)))
            folded = child is not None and child.wait() == 0
        finally:
            if child is not None:
                _stop(child)
        if folded:
            out.joined(spool)
        else:  # the child failed: fold its half here, as one process would have
            out.items(map(encode, j.iter_actions(**filters, span=theirs)))
    out.close()


def _start(spool: IO[bytes]) -> subprocess.Popen[bytes] | None:
    code = "from affidavit.cli.actions_json import fold_span; fold_span()"
    try:
        return subprocess.Popen(
            # -P: not the working directory first on the child's path (`-c` would put it
            # there, unlike the `affidavit` script): only the installed broker is imported.
            [sys.executable, "-P", "-c", code],
            stdin=subprocess.PIPE,
            stdout=spool,
            stderr=subprocess.DEVNULL,  # its failure is not reported: its half is redone
        )
    except OSError:
        return None


def _stop(child: subprocess.Popen[bytes]) -> None:
    """Kill ``child`` if it still runs (a child never told its half waits on stdin), and close
    the pipe to it."""
    if child.poll() is None:
        child.kill()
        child.wait()
    if child.stdin is not None:
        with contextlib.suppress(OSError):
            child.stdin.close()


def _send(
    child: subprocess.Popen[bytes],
    path: str,
    filters: dict[str, Any],
    span: tuple[int, int, int],
    windows: Mapping[str, float] | None,
) -> bool:
    """Tell ``child`` what to fold, and the send windows its hints are judged by (the
    parent's reader's); False if it can no longer be told (it has exited)."""
    spec = json.dumps({"path": path, "filters": filters, "span": list(span), "windows": windows})
    assert child.stdin is not None
    try:
        with child.stdin:
            child.stdin.write(spec.encode("utf-8") + b"\n")
    except OSError:  # BrokenPipeError: it exited before reading
        return False
    return True


def fold_span() -> None:
    """The child's side: one line on stdin says what to fold; the span's records, encoded and
    joined by ``,\\n``, to stdout; exit status 0 only when all of them were written.  The
    broker is imported before that line is read (see ``write_actions_json``)."""
    from affidavit.journal import JournalReader
    from affidavit.views import record_json_encoder

    line = sys.stdin.readline()
    if not line:  # the parent did not cut the journal after all
        sys.exit(1)
    spec = json.loads(line)
    first, before, through = spec["span"]
    with JournalReader.open(spec["path"]) as j:
        j.send_windows = spec.get("windows")  # the parent's: its hints are judged alike
        records = j.iter_actions(**spec["filters"], span=(first, before, through))
        # Embedded: whoever reads the journal is its operator (no hash withheld).
        encode = record_json_encoder(operator=True)
        _Array("").items(map(encode, records))  # no brackets: a run of items
    sys.stdout.flush()  # a failed write is a failed child (exit status 1): never a short half
