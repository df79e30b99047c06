"""Redaction's scan: candidates found with ``bytes.find`` (needles in the lower-cased input,
escape bytes), the compiled pattern run only in windows around them (``_scan``): exactly one
``re.sub`` of the pattern over the whole input, at ``find`` speed on a clean body -- but for a
base64 form mixing the two alphabets, which the pattern matches and no needle holds
(docs/redaction.md, Speed): it is redacted only inside a window an escape in it or a needle
near it brings.
"""

from __future__ import annotations

import re

from .redaction_forms import RAW_BREAK, joined
from .redaction_plan import Anchors, _Plan

REDACTED = b"[REDACTED]"
SHORT_REDACTED = bytes(bytearray(REDACTED))
"""``REDACTED``'s bytes, another object: ``_scan`` puts it where the match was a form of a
value under ``MIN_ANY_CASE`` bytes only (``_Plan`` marks those alternatives with an empty
group), so the redactor can tell "an echo" from "may be ordinary text" (``short_echoed``)."""

_ANCHORED_MIN = 65536
"""Inputs at least this long are first searched for anchors (``_anchor_hits``); a shorter one
is scanned whole at once, where the anchors' ``find`` runs would cost a larger share (a small
body; a read over TLS, a record of at most 16 KiB).  A long plain-HTTP body's reads grow to
1 MiB (``adapters/http/exchange.py``)."""
_HITS_PER = 16384
_HITS_FLOOR = 4
"""At most one anchor hit per ``_HITS_PER`` input bytes, plus ``_HITS_FLOOR``, is looked at
around (``_around``); past that the input is scanned whole (``_everywhere``): a window costs a
few microseconds, a whole MiB one to three milliseconds."""
_MISSES = 3
"""Needle bytes tried per input that its first eighth holds too many of, before the input is
scanned whole: a body holding every byte (binary, base64, prose) gives up after a few short
``find`` runs."""
_MARGIN = 16
"""Bytes a window around an anchor hit reaches past the widest match on either side."""


def _candidates(plan: _Plan, buf: bytes, limit: int) -> list[int] | None:
    """Positions every match holds one of (see ``_everywhere``); None once there are more than
    ``limit``: their windows would cover the buffer anyway.  A long input is first searched for
    anchors (``_anchor_hits``): where none occurs -- most bodies hold no echo -- there is no
    candidate, found at ``memchr`` speed without the lower-cased copy, the copy without line
    breaks and a ``find`` pass per needle over the whole input; where few do, only the windows
    around them are scanned so (``_around``)."""
    anchors = plan.anchors
    if len(buf) >= _ANCHORED_MIN and anchors is not None:
        hits = _anchor_hits(plan, anchors, buf, len(buf) // _HITS_PER + _HITS_FLOOR)
        if hits is not None:
            return _around(plan, buf, hits, limit) if hits else []
    return _everywhere(plan, buf, limit)


def _anchor_hits(plan: _Plan, anchors: Anchors, buf: bytes, cap: int) -> list[int] | None:
    """Every position in ``buf`` of an escape byte and of one byte of each needle (in either
    case, if a letter), or None if that would be more than ``cap`` positions.  Every match holds
    one: a match holds a needle (in the lower-cased input, maybe without raw line breaks) or an
    escape (``_everywhere``), and every byte of a needle but a line break is a byte of the
    match, lower-cased.  Each needle takes the first of its bytes, rarest first (``anchors``,
    the plan's), that the input's first eighth holds at most an eighth of ``cap`` of; after
    ``_MISSES`` bytes that it holds more of (a body holding every byte), or an escape byte it
    holds more of, the input is given up on -- each such miss known after a few ``find``s."""
    head, few = len(buf) >> 3, (cap >> 3) + 1
    chosen: dict[tuple[bytes, ...], None] = {(first,): None for first, _ in plan.escapes}
    if not all(_finds(buf, byte, [], few, head) for byte in chosen):
        return None
    probed: dict[tuple[bytes, ...], bool] = {}
    for choices in anchors:
        for byte in choices:
            if byte not in probed:
                probed[byte] = _finds(buf, byte, [], few, head)
                if not probed[byte] and len(probed) - sum(probed.values()) >= _MISSES:
                    return None
            if probed[byte]:
                chosen[byte] = None
                break
        else:
            return None
    out: list[int] = []
    if not all(_finds(buf, byte, out, cap) for byte in chosen):
        return None
    return out


def _around(plan: _Plan, buf: bytes, hits: list[int], limit: int) -> list[int] | None:
    """The candidates of the windows around ``hits`` (merged where they meet), each scanned as
    ``_everywhere`` scans a whole input, but with each escape tried at every byte it may start
    at (``every``), not only from the end of the last one found: where a window starts, the
    whole input's scan of escapes may be inside a match (its bytes joined across raw breaks).
    A match holds a hit, so the window around that holds the whole match and a margin, and in
    it the needle or the escape the match holds."""
    reach = plan.widest + _MARGIN
    spans: list[list[int]] = []
    for h in sorted(hits):
        if spans and h - reach <= spans[-1][1]:
            spans[-1][1] = min(len(buf), h + reach)
        else:
            spans.append([max(0, h - reach), min(len(buf), h + reach)])
    out: list[int] = []
    for start, end in spans:
        found = _everywhere(plan, buf[start:end], limit - len(out), every=True)
        if found is None:
            return None
        out += [start + c for c in found]
    return out


def _everywhere(plan: _Plan, buf: bytes, limit: int, every: bool = False) -> list[int] | None:
    """Positions every match holds one of: a lower-cased needle's start in the lower-cased
    input, a base64 needle's in it without its raw line breaks (``joined``), or an escape (of
    a needle's character, or an escaped line break between two base64 characters).  (A match
    written without escapes is a concrete form, its letters' case maybe changed, wrapped with
    raw breaks if it is base64, and every concrete form contains a needle; a match with an
    escape holds the needle's span, and an escape of one of its characters followed by the
    next in either case -- or by a raw break and the next --, or an escaped break, in it.)
    None once there are more than ``limit``.  ``every``: each escape tried at every place it
    starts, not from the end of the last one found (``_escape_hits``).  Lower-casing costs a
    pass at about 1 GB/s and keeps every position; dropping the raw breaks a copy where there
    are any, two ``find`` passes where there are none."""
    out: list[int] = []
    low = buf.lower()
    if not _finds(low, plan.needles_lower, out, limit):
        return None
    flat = joined(low)
    mark = len(out)
    if not _finds(flat, plan.joined_lower, out, limit):
        return None
    for first, escape in plan.escapes:
        if not _escape_hits(flat, first, escape, out, limit, every):
            return None
    if flat is not low and len(out) > mark:
        out[mark:] = _unjoined(low, out[mark:])
    out.sort()
    return out


def _finds(
    text: bytes, needles: tuple[bytes, ...], out: list[int], limit: int, end: int | None = None
) -> bool:
    """Append every start of each needle in ``text[:end]`` to ``out`` (False past ``limit``)."""
    find = text.find
    for needle in needles:
        i = find(needle, 0, end)
        while i >= 0:
            out.append(i)
            if len(out) > limit:
                return False
            i = find(needle, i + 1, end)
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
    buf: bytes,
    first: bytes,
    escape: re.Pattern[bytes],
    out: list[int],
    limit: int,
    every: bool = False,
) -> bool:
    """Append the start of every ``escape.finditer(buf)`` match to ``out`` (False once it holds
    more than ``limit``).  ``re`` scans for even a literal first byte at ~1 ms per MiB here,
    ``find`` at ~0.04 (issue 15: two such scans were most of a clean 50 MiB body's
    redaction), so the escape byte is found first and the pattern tried only there -- the
    same matches, as a match can start nowhere else and the next one is looked for from the
    end of the last, as ``finditer`` does.  Past ``_FIND_EACH`` escape bytes (a body dense with
    them) one ``finditer`` scans the rest.  ``every``: the pattern is tried at every escape
    byte, also inside the last match (a window's scan, ``_around``: where it starts, the
    whole input's scan may be in the middle of a match)."""
    find, match = buf.find, escape.match
    pos = tries = 0
    while (i := find(first, pos)) >= 0:
        tries += 1
        if tries > _FIND_EACH and not every:
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
        pos = i + 1 if every else m.end()
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

    Why this equals ``pattern.sub`` over the whole input (but for a base64 form mixing the
    two alphabets, which holds no needle: the module docstring): every match starting at ``p`` has a
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
            out.append(REDACTED if m.lastindex is None else SHORT_REDACTED)
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
