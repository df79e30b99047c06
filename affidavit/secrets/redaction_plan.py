"""Redaction plans: one set of values' needles, escapes and lazily compiled patterns
(``_Plan``), and the per-process cache of them that a credential's rotation empties
(``retain``, ``release``).  The forms they are built from: ``redaction_forms.py``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable

from .redaction_forms import (
    LONG_VALUE,
    RAW_BREAK,
    _alternation,
    _alts,
    _any_case,
    _any_case_literal,
    _escapes,
    _fold,
    _literal_forms,
    _minimal,
    _pem_lines,
    _slot_regex,
    _value_slots,
    _width,
    base64_forms,
    compile_secret,
    joined,
    long_alts,
    long_needle,
    long_width,
    secret_forms,
)


class _Plan:
    """What a ``Redactor`` needs for one set of values (built once per set, cached)."""

    def __init__(self, values: tuple[bytes, ...]) -> None:
        self.values = values
        """The sorted values (``_plan``'s key)."""
        # A long value (a private key, a session token) and the body lines of a PEM value are
        # matched in their raw and whole-base64 forms, each byte but a letter or digit also
        # escaped (``long_alts``): with every unit encoding, hex and shifted base64 their
        # patterns would take seconds to compile.
        literal = {v for v in values if len(v) > LONG_VALUE}
        for v in values:
            literal |= _pem_lines(v)
        forms: set[bytes] = set()
        groups: dict[int, dict[bytes, int]] = {}
        widest = 0
        for v in sorted(literal):  # longer than MIN_ANY_CASE: matched in any case
            for form in _literal_forms(v):
                width = long_width(form)
                for first, rest in long_alts(form):
                    branch = groups.setdefault(first, {})
                    branch[rest] = max(branch.get(rest, 0), width)
                forms.add(long_needle(form))
                widest = max(widest, width)
        encoded = sorted(set(values) - literal)
        by_value = [(v, f) for v in encoded for f in secret_forms(v)]
        encoded_forms = {f for _, f in by_value}
        forms |= encoded_forms
        self._literal_groups = groups
        self.tail: int | None = None
        """The bytes a stream cut short withholds at its end (``redaction.tail_window``,
        built on first use)."""
        self._encoded = [(slots, _any_case(v)) for v in encoded for slots in _value_slots(v)]
        self._exact = not all(map(_any_case, encoded))
        """Whether a value is short enough for bodies to match it in its forms' case only."""
        self._pattern: re.Pattern[bytes] | None = None
        self._pattern_any_case: re.Pattern[bytes] | None = None
        self.widest = max([widest, *(_width(slots) for slots, _ in self._encoded)])
        """The widest match: a window this wide on each side of a candidate holds every match."""
        wrapped = set().union(*map(base64_forms, encoded))
        needles, escapes = _escapes(_minimal(encoded_forms), bool(wrapped))
        # A base64 form (or the extra needle, a prefix of one, that stands for it when only its
        # last character is escaped) is looked for in the input without its raw line breaks
        # (``joined``): a wrapped form is whole there.  Its escaped breaks are escape
        # candidates.
        whole = _minimal(forms | needles)
        cut = {n for n in whole if any(f.startswith(n) for f in wrapped)}
        self.needles = tuple(n for n in whole if n not in cut)
        """Byte strings to ``find`` as written: every concrete form that is not base64 holds
        one."""
        self.needles_lower = _minimal({n.lower() for n in self.needles})
        """``needles`` lower-cased: a match of ``pattern`` or ``pattern_any_case`` written
        without escapes holds one once lower-cased (``_candidates``, ``may_hold_any_case``)."""
        self.joined_lower = _minimal({n.lower() for n in cut})
        """The base64 forms' needles, lower-cased, to ``find`` in the lower-cased input without
        its raw line breaks (``joined``): a base64 form written without escapes, wrapped with
        raw breaks or not, holds one there."""
        self.escapes = escapes
        """(escape byte, pattern) per escape character: the escapes that may start a match's
        escaped part (each pattern starts with its byte; see ``_escape_hits``)."""
        self.anchors = _anchors((*self.needles_lower, *self.joined_lower))
        """Per needle, its bytes, the rarest first, each with its other case if it is a letter:
        a needle found in the lower-cased input, raw breaks dropped or not, is bytes of
        the input, so each of its bytes is there in one case or the other
        (``redaction_scan._anchor_hits``).  None if a needle has no byte but line breaks."""
        self.owners: dict[Owner, str] = {}
        """Owner -> version, of the credentials this plan's values are (``retain``): a plan
        whose every owner rotated is dropped from the cache."""
        self.unheld: set[str] = set()
        """Short texts ``Redactor.holds_any`` found holding no form, even percent-decoded: every
        response's head lines (``exchange._head_echoed``) are mostly the same few each call.
        Bounded as ``clean``."""
        self.clean: set[str] = set()
        """Short strings already scrubbed that hold no form of the values
        (``Redactor.scrub_text``): every call scrubs the same header names and values, reason
        phrases and fact keys, and a scan costs ~4 us each where a lookup costs ~0.1 (issue
        15's profile: a tenth of the event loop).  Only clean strings are kept -- one holding a
        value is scanned again, never kept alive here.  Bounded: ``_MEMO_TEXTS`` strings of at
        most ``_MEMO_CHARS``."""

    @property
    def pattern(self) -> re.Pattern[bytes]:
        """Every form; a value of ``MIN_ANY_CASE`` bytes or more with each literal letter in
        either case (a class: ``re.IGNORECASE`` would slow the windows' scan down, and merging
        both cases into the slots would triple the compile time).  Built on first use: most
        bodies hold no candidate, and compiling the pattern of a credential costs more than
        scanning megabytes."""
        if self._pattern is None:
            self._pattern = compile_secret(self._source())
        return self._pattern

    def may_hold_any_case(self, raw: bytes) -> bool:
        """False only if ``pattern_any_case`` cannot match ``raw``: a match holds an escape
        (``%``, ``\\`` or ``+``; an escaped line break too) or, lower-cased, a lower-cased
        needle (a base64 one once raw line breaks are dropped).  Most header text holds
        neither, and then the pattern is neither run nor compiled."""
        if b"%" in raw or b"\\" in raw or b"+" in raw:
            return True
        low = raw.lower()
        if any(n in low for n in self.needles_lower):
            return True
        low = joined(low)
        return any(n in low for n in self.joined_lower)

    @property
    def pattern_any_case(self) -> re.Pattern[bytes]:
        """``pattern`` with ASCII letters matched in either case, a short value's too: for a
        remote's short text (header names and values, the reason phrase, a redirect's origin),
        where a server or a URL parser may have changed the case of an echoed form -- a host
        name is lower-cased by every parser.  ``pattern`` itself when no value is short."""
        if self._pattern_any_case is None:
            if self._exact:
                self._pattern_any_case = compile_secret(self._source(True), re.IGNORECASE)
            else:
                self._pattern_any_case = self.pattern
        return self._pattern_any_case

    def _source(self, any_case_all: bool = False) -> bytes:
        """The pattern's source; ``any_case_all``: every value's letters in either case, a short
        one's too, escaped as well as literal (``pattern_any_case``: ``re.IGNORECASE`` folds a
        literal letter, never the digits of its escape)."""
        groups = {first: dict(alts) for first, alts in self._literal_groups.items()}
        for form, own_case in self._encoded:
            any_case = own_case or any_case_all
            rest = [_slot_regex(s, any_case) for s in form[1:]]
            rest_re = b"".join(r for r, _ in rest)
            rest_w = sum(w for _, w in rest)
            chars, optional, wrap = form[0]
            assert not optional and not wrap
            for f, frag, w in (a for c in chars for a in _alts(c, any_case)):
                # The branch of a letter takes either case; a short value's exact first letter
                # is checked behind it.
                exact = not any_case and bytes([f]).isalpha()
                alt = (b"(?<=" + bytes([f]) + b")" if exact else b"") + frag + rest_re
                if not own_case:
                    alt += b"()"  # a short value's: ``m.lastindex`` says so (``SHORT_REDACTED``)
                branch = groups.setdefault(_fold(f), {})
                branch[alt] = max(branch.get(alt, 0), w + rest_w)
        # One top-level branch per first byte (a letter in either case), each starting with that
        # byte; within a branch the widest alternatives first, so leftmost-first picks the
        # longest form.
        parts = []
        for first in sorted(groups):
            alts = sorted(groups[first].items(), key=lambda kv: (-kv[1], kv[0]))
            parts.append(_any_case_literal(bytes([first])) + _alternation(a for a, _ in alts))
        return b"|".join(parts)


_COMMON = b' etaoinsrhl"0123456789dcum:,.fpgwyb/-_vk=xj+qz'
"""Bytes by how often text bodies (prose, JSON, logs, URLs) hold them, most often first, lower
case (needles are lower-cased); any other byte counts as rarer than all of them.  Only an
order to try a needle's bytes in (``redaction_scan._anchor_hits``): a wrong guess costs a few
``find`` calls, never a match."""


Anchors = tuple[tuple[tuple[bytes, ...], ...], ...]
"""Per needle, per byte tried: the byte strings to find (a letter in both cases)."""


def _anchors(needles: Iterable[bytes]) -> Anchors | None:
    """``_Plan.anchors`` of ``needles``: per needle, its bytes but line breaks (``joined``
    drops them), the rarest first -- each as the byte strings to find, a letter in both
    cases."""
    out = []
    for needle in needles:
        usable = {b for b in needle if b not in RAW_BREAK}
        if not usable:
            return None
        rare = sorted(usable, key=_commonness)
        out.append(tuple(tuple(sorted({bytes([b]), bytes([b]).upper()})) for b in rare))
    return tuple(out)


def _commonness(byte: int) -> tuple[int, int]:
    """Sorts the rarest first: unlisted bytes, then ``_COMMON`` from its end."""
    rank = _COMMON.find(bytes([byte]))
    return (-len(_COMMON) if rank < 0 else -rank, byte)


_PLANS = 64
"""Plans the cache keeps (least recently used first out)."""
_plans: OrderedDict[tuple[bytes, ...], _Plan] = OrderedDict()
"""The plan cache: each plan under its sorted key and under each tuple it was asked for as
given (``_plan_for``).  Its keys and plans hold credential values, so a rotated credential's
entries are dropped as soon as its new version is used (``retain``), not left to age out."""
Owner = tuple[object, str]
"""Who a plan's values are the credential of: (a scope -- the engine's id --, the reference)."""
_versions: dict[Owner, str] = {}
"""The version each owner's credential was last used at (``retain``): non-secret."""
_retired: dict[bytes, None] = {}
"""Keyed digests (``_digest``) of the sorted values of plans a rotation dropped, oldest first
(at most ``_PLANS``): a call still under way with the old value may ask for its plan again (a
result stream starting late), and gets one that is not put back into the cache."""
_DIGEST_KEY = os.urandom(32)
_lock = threading.Lock()


def _digest(values: tuple[bytes, ...]) -> bytes:
    """A per-process keyed digest of sorted ``values``: names them without holding them."""
    mac = hmac.new(_DIGEST_KEY, digestmod=hashlib.sha256)
    for v in values:
        mac.update(len(v).to_bytes(8, "big") + v)
    return mac.digest()


def _plan(values: tuple[bytes, ...]) -> _Plan | None:
    """The cached plan of sorted, non-empty ``values``: the engine builds a redactor per result
    stream, and the same credential's plan is the same plan."""
    if not values:
        return None
    with _lock:
        plan = _plans.get(values)
        if plan is not None:
            _plans.move_to_end(values)
            return plan
    plan = _Plan(values)  # outside the lock: only the pattern is costly, and it is lazy
    if _retired and _digest(values) in _retired:
        return plan  # a rotated credential's old value: for its caller only, never cached
    with _lock:
        plan = _plans.setdefault(values, plan)
        _plans.move_to_end(values)
        _trim()
    return plan


def _trim() -> None:
    keys = {id(p) for p in _plans.values()}
    while len(keys) > _PLANS:
        _, old = _plans.popitem(last=False)
        if old not in _plans.values():
            keys.discard(id(old))


def _plan_for(secrets: Iterable[bytes]) -> _Plan | None:
    """``_plan`` of the non-empty values, sorted: for a tuple, looked up by the tuple as given
    -- a call makes three redactors of its credential's one tuple (the sink, each stream, the
    redirect check), and sorting it into ``_plan``'s key each time cost more than the lookup
    (issue 15).  Anything else (or a tuple that cannot be a key) takes the sorted key."""
    if type(secrets) is tuple:
        try:
            with _lock:
                plan = _plans.get(secrets)
                if plan is not None:
                    _plans.move_to_end(secrets)
                    return plan
        except TypeError:
            pass
        else:
            plan = _plan(tuple(sorted({s for s in secrets if s})))
            if plan is not None:
                with _lock:
                    if plan in _plans.values():  # not dropped by a rotation meanwhile
                        _plans[secrets] = plan
                        _trim()
            return plan
    return _plan(tuple(sorted({s for s in secrets if s})))


def retain(owner: Owner, version: str, values: Iterable[bytes]) -> None:
    """Note that ``owner``'s credential is now at ``version`` and injects ``values``.  If it was
    last noted at another version (the credential rotated), every cached plan of its old values
    is dropped: the old secret is then held only by the redactors of calls still using it, and
    no longer than they live.  A plan another owner still uses (the same value under another
    reference) stays, and so does one of ``values`` (a version that moved, a value that did
    not: a touched file).  Versions are non-secret (``Credential.version``); the engine calls
    this once per resolved credential, its id as the scope (an ``env:`` version is keyed per
    journal: two engines in one process must not see each other's as a rotation)."""
    key = tuple(sorted({v for v in values if v}))
    with _lock:
        previous = _versions.get(owner)
        _versions[owner] = version
        if previous is not None and previous != version:
            for plan in {id(p): p for p in _plans.values()}.values():
                if plan.values == key or plan.owners.pop(owner, None) is None or plan.owners:
                    continue
                _drop(plan)
                _retired[_digest(plan.values)] = None
            while len(_retired) > _PLANS:
                del _retired[next(iter(_retired))]
        if len(_versions) > 4 * _PLANS:
            owning = {o for p in _plans.values() for o in p.owners}
            for o in [o for o in _versions if o not in owning and o != owner]:
                del _versions[o]
        if _retired and key:
            # Rotated back to a value dropped before: its plan is cached again from here on.
            _retired.pop(_digest(key), None)
    current = _plan(key)
    if current is not None:
        with _lock:
            current.owners[owner] = version


def release(scope: object) -> None:
    """Forget ``scope``'s credentials (an engine closing: its config is done with): a plan no
    other scope's credential uses is dropped, its values no longer held by the cache."""
    with _lock:
        for plan in {id(p): p for p in _plans.values()}.values():
            mine = [o for o in plan.owners if o[0] == scope]
            for o in mine:
                del plan.owners[o]
            if mine and not plan.owners:
                _drop(plan)
        for o in [o for o in _versions if o[0] == scope]:
            del _versions[o]


def _drop(plan: _Plan) -> None:
    for key in [k for k, p in _plans.items() if p is plan]:
        del _plans[key]


def clear_plans() -> None:
    """Drop every cached plan (the benchmark times a new credential's)."""
    with _lock:
        _plans.clear()
        _versions.clear()
        _retired.clear()
