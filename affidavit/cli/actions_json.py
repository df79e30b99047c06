"""``affidavit actions --json`` read from the journal: one JSON array, one record per line,
written as the records are folded -- and over a large journal, folded by two processes.

The fold and the encoder are Python, on one core (issue 15: 1M events in <= 10 s).  When the
journal can be cut (``JournalReader.action_spans``: SQLite with its index of first events, no
session filter) and the machine has a second core, a child process folds the later half of the
invocations into an unnamed temporary file while this one folds and writes the first half; its
text is then copied out after them.  Both halves read through the same head seq, so together
they are the records one read would give.  The child only saves time: if it fails in any way
(an error, a crash, killed), this process folds that half itself, so the output, and an error
part-way with every record before it written, are what one process would give.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

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
        write = sys.stdout.write
        block: list[str] = []
        add = block.append
        try:
            for text in texts:
                add(self.sep)
                add(text)
                self.sep = ",\n"
                if len(block) >= 1024:
                    write("".join(block))
                    block.clear()
        finally:
            # A record that fails part-way (a journal error) still leaves every record before
            # it written, as one write per record did: nothing folded is held back.
            write("".join(block))

    def joined(self, spool: IO[bytes]) -> None:
        """Items another process wrote to ``spool``, joined by ``,\\n``, copied as they are."""
        spool.seek(0)
        chunk = spool.read(_COPY)
        if not chunk:
            return
        write = sys.stdout.write
        write(self.sep)
        self.sep = ",\n"
        while chunk:
            write(chunk.decode("utf-8"))
            chunk = spool.read(_COPY)

    def close(self) -> None:
        sys.stdout.write("[]\n" if self.sep == "[\n" else "\n]\n")


def write_array(texts: Iterable[str]) -> None:
    """JSON texts written as one array, one item per line."""
    out = _Array()
    out.items(texts)
    out.close()


def write_actions_json(j: JournalReader, filters: dict[str, Any]) -> None:
    """The actions view of ``j`` (``iter_actions(**filters)``) as ``--json`` prints it."""
    from affidavit.views import record_json_encoder

    encode = record_json_encoder()
    spans = None
    if filters.get("session") is None and (os.cpu_count() or 1) > 1 and j.path is not None:
        spans = j.action_spans(2, SPLIT_MIN_EVENTS)
    if spans is None or len(spans) != 2:
        write_array(map(encode, j.iter_actions(**filters)))
        return
    mine, theirs = spans
    out = _Array()
    with tempfile.TemporaryFile() as spool:
        child = _start(str(j.path), filters, theirs, spool)
        try:
            out.items(map(encode, j.iter_actions(**filters, span=mine)))
            folded = child is not None and child.wait() == 0
        finally:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
        if folded:
            out.joined(spool)
        else:  # the child failed: fold its half here, as one process would have
            out.items(map(encode, j.iter_actions(**filters, span=theirs)))
    out.close()


def _start(
    path: str, filters: dict[str, Any], span: tuple[int, int, int], spool: IO[bytes]
) -> subprocess.Popen[bytes] | None:
    spec = json.dumps({"path": path, "filters": filters, "span": list(span)})
    code = "from affidavit.cli.actions_json import fold_span; fold_span()"
    try:
        return subprocess.Popen(
            # -P: not the working directory first on the child's path (`-c` would put it
            # there, unlike the `affidavit` script): only the installed broker is imported.
            [sys.executable, "-P", "-c", code, spec],
            stdin=subprocess.DEVNULL,
            stdout=spool,
            stderr=subprocess.DEVNULL,  # its failure is not reported: its half is redone
        )
    except OSError:
        return None


def fold_span() -> None:
    """The child's side (``sys.argv[1]``: what to fold): the span's records, encoded and
    joined by ``,\\n``, to stdout; exit status 0 only when all of them were written."""
    from affidavit.journal import JournalReader
    from affidavit.views import record_json_encoder

    spec = json.loads(sys.argv[1])
    first, before, through = spec["span"]
    with JournalReader.open(spec["path"]) as j:
        records = j.iter_actions(**spec["filters"], span=(first, before, through))
        _Array("").items(map(record_json_encoder(), records))  # no brackets: a run of items
    sys.stdout.flush()  # a failed write is a failed child (exit status 1): never a short half
