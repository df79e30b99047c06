"""Redaction's scan: candidates found with ``bytes.find`` (needles in the lower-cased input,
escape bytes), the compiled pattern run only in windows around them (``_scan``): exactly one
``re.sub`` of the pattern over the whole input, at ``find`` speed on a clean body.
"""

from __future__ import annotations

import re

from .redaction_forms import RAW_BREAK, joined
from .redaction_plan import _Plan

REDACTED = b"[REDACTED]"


def _candidates(plan: _Plan, buf: bytes, limit: int) -> list[int] | None:
    """Positions every match holds one of: a lower-cased needle's start in the lower-cased
    input, a base64 needle's in it without its raw line breaks (``joined``), or an escape (of
    a needle's character, or an escaped line break between two base64 characters).  (A match
    written without escapes is a concrete form, its letters' case maybe changed, wrapped with
    raw breaks if it is base64, and every concrete form contains a needle; a match with an
    escape holds the needle's span, and an escape of one of its characters followed by the
    next in either case -- or by a raw break and the next --, or an escaped break, in it.)
    None once there are more than ``limit``: their windows would cover the buffer anyway.
    Lower-casing costs a pass at about 1 GB/s and keeps every position; dropping the raw
    breaks a copy where there are any, two ``find`` passes where there are none."""
    out: list[int] = []
    low = buf.lower()
    if not _finds(low, plan.needles_lower, out, limit):
        return None
    flat = joined(low)
    mark = len(out)
    if not _finds(flat, plan.joined_lower, out, limit):
        return None
    for first, escape in plan.escapes:
        if not _escape_hits(flat, first, escape, out, limit):
            return None
    if flat is not low and len(out) > mark:
        out[mark:] = _unjoined(low, out[mark:])
    out.sort()
    return out


def _finds(text: bytes, needles: tuple[bytes, ...], out: list[int], limit: int) -> bool:
    """Append every start of each needle in ``text`` to ``out`` (False past ``limit``)."""
    find = text.find
    for needle in needles:
        i = find(needle)
        while i >= 0:
            out.append(i)
            if len(out) > limit:
                return False
            i = find(needle, i + 1)
    return True


def _unjoined(low: bytes, hits: list[int]) -> list[int]:
    """Positions in ``joined(low)`` as positions in ``low`` (sorted): the one of the ``q``-th
    kept byte is the least ``r`` with ``r = q + `` the dropped bytes in ``low[: r + 1]``,
    reached from below by counting them (``count``: memchr speed) in each stretch once, hits
    taken in order.  Run only for a chunk where a needle or an escape was found."""
    out: list[int] = []
    done = dropped = 0  # low[:done] holds ``dropped`` dropped bytes
    for q in sorted(hits):
        r = q + dropped
        while True:
            more = sum(low.count(b, done, r + 1) for b in RAW_BREAK)
            done, dropped = r + 1, dropped + more
            if not more:
                break
            r += more
        out.append(r)
    return out


_FIND_EACH = 4
"""Escape bytes located one ``find`` at a time before one regex scan takes over the rest."""


def _escape_hits(
    buf: bytes, first: bytes, escape: re.Pattern[bytes], out: list[int], limit: int
) -> bool:
    """Append the start of every ``escape.finditer(buf)`` match to ``out`` (False once it holds
    more than ``limit``).  ``re`` scans for even a literal first byte at ~1 ms per MiB here,
    ``find`` at ~0.04 (issue 15: two such scans were most of a clean 50 MiB body's
    redaction), so the escape byte is found first and the pattern tried only there -- the
    same matches, as a match can start nowhere else and the next one is looked for from the
    end of the last, as ``finditer`` does.  Past ``_FIND_EACH`` escape bytes (a body dense with
    them) one ``finditer`` scans the rest."""
    find, match = buf.find, escape.match
    pos = tries = 0
    while (i := find(first, pos)) >= 0:
        tries += 1
        if tries > _FIND_EACH:
            for found in escape.finditer(buf, i):  # nothing can match in [pos, i)
                out.append(found.start())
                if len(out) > limit:
                    return False
            return True
        m = match(buf, i)
        if m is None:
            pos = i + 1
            continue
        out.append(i)
        if len(out) > limit:
            return False
        pos = m.end()
    return True


def _scan(
    plan: _Plan, buf: bytes, decided: int, view: bytes | memoryview | None = None
) -> tuple[list[bytes | memoryview], int]:
    """Redact ``buf`` up to ``decided`` (matches starting before it): (output pieces, where the
    undecided rest starts).  Bytes from ``decided`` on may be the start of a match that needs
    more input, unless ``decided == len(buf)``.  The pieces kept are slices of ``view`` (by
    default ``buf`` itself): given ``memoryview(buf)``, views rather than copies, so that whoever
    joins or appends them copies each byte once (issue 15: a clean 50 MiB body was copied twice
    here).

    Why this equals ``pattern.sub`` over the whole input: every match starting at ``p`` has a
    candidate in ``[p, p + widest)``, so windows ``[c - widest + 1, c + widest]`` around the
    candidates (merged when they overlap) hold every match start, and a match starting at or
    before a window's last candidate lies wholly inside the window (it is at most ``widest``
    long).  Within a window ``finditer`` scans exactly as a whole-input scan would; a match it
    finds beyond the last candidate may be cut by the window's end, so it is left to a later
    window, which also holds its start."""
    widest = plan.widest
    cands = _candidates(plan, buf, len(buf) // (2 * widest) + 8)
    windows = [(0, len(buf), len(buf))] if cands is None else _windows(cands, widest, len(buf))
    if view is None:
        view = buf
    out: list[bytes | memoryview] = []
    pos = 0
    for start, last, end in windows:
        if last < pos:
            continue
        for m in plan.pattern.finditer(buf, max(pos, start), end):
            if m.start() > last or m.start() >= decided:
                break
            out.append(view[pos : m.start()])
            out.append(REDACTED)
            pos = m.end()
    if decided > pos:
        out.append(view[pos:decided])
        pos = decided
    return out, pos


def _windows(cands: list[int], widest: int, size: int) -> list[tuple[int, int, int]]:
    """(start, last candidate, end) of the merged windows around sorted ``cands``."""
    out: list[tuple[int, int, int]] = []
    for c in cands:
        if out and c - widest + 1 <= out[-1][1] + widest:
            out[-1] = (out[-1][0], c, min(size, c + widest))
        else:
            out.append((max(0, c - widest + 1), c, min(size, c + widest)))
    return out
