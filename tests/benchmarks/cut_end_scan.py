"""The end-of-text rule (``redaction._form_begun``: does a text end with the beginning of a form
of a secret?) as it was -- each candidate position's tail copied and compared with every form
(``form.startswith(text[i:])``) -- beside the rule now (each form's first ``cut_floor`` bytes
found with ``find`` in the last ``len(form)`` bytes, the rest compared in place), in one run:
``scrub_text`` of a 16 KiB header value (random letters; and the worst case, every byte the
forms' first), of 20k random header values (8-80 printable characters), and of crafted
endings (every form's beginning, from one byte under the floor to one short of whole, as sent
and upper-cased, after a word: the rule's match branch), each timed through
``Redactor.scrub_text`` (what a response head costs) and through the rule alone.  Both rules
must give the same answers on every input, the crafted endings must be matched by some (a
check that never reaches the match branch proves nothing), and the two are timed in
alternating order, best of 6.

    .venv/bin/python tests/benchmarks/cut_end_scan.py [--values 20000]

A script, not a test.
"""

from __future__ import annotations

import argparse
import random
import string
import time
from collections.abc import Callable
from typing import Any

from affidavit.secrets import redaction
from affidavit.secrets.redaction import CUT_FORM, Redactor, cut_floor

SECRET = b"sk_live_Q7pW3xN9rT2vL5mK8jH4"
VALUES = [SECRET, b"Bearer " + SECRET]


def _before(plan: Any, data: bytes, any_case_all: bool = False) -> int:
    """``_form_begun`` before this change (the floor as now: ``cut_floor``)."""
    tail = data[-plan.widest :]
    low = tail.lower()
    best = len(tail)
    for form, any_case, public in plan.starts:
        text = low if any_case or any_case_all else tail
        i = text.find(form[:1], max(0, len(text) - len(form) + 1))
        floor = cut_floor(len(form) - public)
        while 0 <= i <= len(text) - floor - public and i < best:
            if form.startswith(text[i:]):
                best = i
                break
            i = text.find(form[:1], i + 1)
    return len(data) - len(tail) + best


def _took(run: Callable[..., object], rules: tuple[Any, Any], *args: Any) -> list[float]:
    """Best of 6 of ``run`` with each of ``rules``, their order alternated each round (neither
    always runs second, on caches the other warmed)."""
    took: list[list[float]] = [[], []]
    for k in range(6):
        for j in (0, 1) if k % 2 == 0 else (1, 0):
            start = time.perf_counter()
            run(rules[j], *args)
            took[j].append(time.perf_counter() - start)
    return [min(t) for t in took]


def _crafted(plan: Any) -> list[str]:
    """Texts that end with a form's beginning: from one byte under its floor to one short of
    the whole form, as the form is and upper-cased."""
    out = []
    for form, _, public in plan.starts:
        need = public + cut_floor(len(form) - public)
        for n in range(need - 1, len(form)):
            for end in (form[:n], form[:n].upper()):
                out.append("seen: " + end.decode("latin-1"))
    return out


def _rule(rule: Callable[..., int], plan: Any, red: Redactor, texts: Any, raws: Any) -> None:
    for raw in raws:
        rule(plan, raw, True)


def _scrub(rule: Callable[..., int], plan: Any, red: Redactor, texts: Any, raws: Any) -> None:
    now, redaction._form_begun = redaction._form_begun, rule
    plan.clean.clear()  # every value scanned, none remembered clean
    for text in texts:
        red.scrub_text(text)
    redaction._form_begun = now


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--values", type=int, default=20000)
    n = parser.parse_args().values
    rng = random.Random(7)
    letters = string.ascii_letters + string.digits + " -_;=,/"
    now = redaction._form_begun
    red = Redactor(VALUES)
    plan = red._plan
    texts = {
        "16 KiB random": ["".join(rng.choice(letters) for _ in range(16384))],
        "16 KiB worst": ["s" * 16384],
        f"{n} random values": [
            "".join(rng.choice(letters) for _ in range(rng.randint(8, 80))) for _ in range(n)
        ],
        "crafted endings": _crafted(plan),
    }
    print(f"forms {len(plan.starts)}, widest {plan.widest}, CUT_FORM {CUT_FORM}")
    print(f"{'input':20} {'path':10} {'before ms':>10} {'now ms':>10} {'now/before':>10} matched")
    for name, group in texts.items():
        raws = [t.encode() for t in group]
        for path in ("rule", "scrub_text"):
            run = _rule if path == "rule" else _scrub
            answers = [now(plan, r, True) for r in raws]
            assert [_before(plan, r, True) for r in raws] == answers, name
            matched = sum(a < len(r) for a, r in zip(answers, raws, strict=True))
            assert matched or name != "crafted endings", "no crafted ending was matched"
            before, after = _took(run, (_before, now), plan, red, group, raws)
            print(
                f"{name:20} {path:10} {before * 1e3:10.2f} {after * 1e3:10.2f} "
                f"{after / before:10.2f}x {matched}/{len(raws)}"
            )


if __name__ == "__main__":
    main()
