"""``affidavit.text.printable`` on text with nothing to escape, the rule before combining marks
counted (``isprintable`` and no ``INVISIBLE`` character: C speed) beside the rule now (for text
beyond ASCII, ``pieces`` walks it for its marks), in one run: ``--mib`` Mi characters of ASCII,
of French text (é, precomposed and as e + U+0301), and of CJK; time of each and their ratio.

    .venv/bin/python tests/benchmarks/printable_text.py [--mib 1]

A script, not a test.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from affidavit.text import INVISIBLE, printable


def _before(text: str) -> str:
    if text.isprintable() and (text.isascii() or INVISIBLE.isdisjoint(text)):
        return text
    return printable(text)


def _took(fn: Callable[[str], str], text: str) -> float:
    """The best of three runs of ``fn(text)`` (the first builds the set of marks, ~30 ms)."""
    took = []
    for _ in range(3):
        start = time.perf_counter()
        fn(text)
        took.append(time.perf_counter() - start)
    return min(took)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=float, default=1.0)
    n = int(parser.parse_args().mib * 2**20)
    texts = {
        "ascii": ("the quick brown fox " * n)[:n],
        "french": ("vérifié déjà reçu " * n)[:n],
        "french decomposed": ("ve\u0301rifie\u0301 de\u0301ja\u0300 " * n)[:n],
        "cjk": ("中文文本测试" * n)[:n],
    }
    print(f"{'text':18} {'before s':>9} {'now s':>9} {'now/before':>10}")
    for name, text in texts.items():
        before, now = _took(_before, text), _took(printable, text)
        print(f"{name:18} {before:9.4f} {now:9.4f} {now / before:10.1f}x")


if __name__ == "__main__":
    main()
