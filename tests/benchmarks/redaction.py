"""Redaction throughput: the broker's ``Redactor`` vs the literal-forms redactor it replaced, side
by side in one run, over 50 MiB bodies fed in the engine's 64 KiB chunks.

    .venv/bin/python tests/benchmarks/redaction.py [--mib N] [--repeat R] [--ab OLD_CHECKOUT]

Bodies: ``json`` (records with a URL, an escaped backslash path, a percent escape), ``random``
(binary), ``php_json`` (every ``/`` escaped as ``\\/`` -- the case where escapes of a base64
character are everywhere), ``echo`` (``json`` with the token echoed JSON-escaped once per MiB),
``mime`` (random bytes as MIME base64: 76 columns, CRLF, the token's base64 inside once per MiB,
across a line break), ``lines`` (``large_result.py``'s answer: numbered lines of a few words, no
escape byte and not every letter -- a body the anchors, rare bytes of the needles, clear at
``memchr`` speed) and ``pieces`` (the adversary of wrapped forms: nothing but the token's
base64 in halves, each on its own line, so the whole body is a chain of wrapped matches).
The credential is a bearer token whose base64 forms hold ``/`` and ``+`` (the worst case for
escape candidates), and the redactor knows it and ``Bearer <token>``, as the HTTP binding lists
them.  Also printed: building a redactor for a new credential (the pattern is compiled lazily, on
the first candidate).  ``--ab DIR`` adds a column for the ``Redactor`` of another checkout (the
commit before a change), run in the same rounds.  ``--cpu`` times the bodies in process CPU
seconds rather than wall time: on a loaded machine they vary far less.  A script, not a test:
it prints figures and asserts nothing about time.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from affidavit.secrets import redaction
from affidavit.secrets.redaction import Redactor

TOKEN = b"tok-6YgyY0Jc8EKXC0/JVUPImH2T+mksDrTk"
CHUNK = 64 * 1024


class LiteralRedactor:
    """The redactor before issue 9: one regex of the literal raw/base64/percent forms."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        forms: set[bytes] = set()
        for s in secrets:
            forms.add(s)
            for enc in (base64.b64encode(s), base64.urlsafe_b64encode(s)):
                forms |= {enc, enc.rstrip(b"=")}
            quoted = urllib.parse.quote_from_bytes(s, safe="")
            forms |= {quoted.encode(), quoted.replace("%20", "+").encode()}
        ordered = sorted(forms, key=lambda f: (-len(f), f))
        self._max = len(ordered[0])
        self._re = re.compile(b"|".join(re.escape(f) for f in ordered))
        self._buf = b""

    def feed(self, data: bytes) -> bytes:
        buf = self._buf + data
        safe = len(buf) - (self._max - 1)
        out: list[bytes] = []
        pos = 0
        while pos < safe:
            m = self._re.search(buf, pos)
            if m is None or m.start() >= safe:
                out.append(buf[pos:safe])
                pos = safe
                break
            out.append(buf[pos : m.start()])
            out.append(b"[REDACTED]")
            pos = m.end()
        self._buf = buf[pos:]
        return b"".join(out)

    def flush(self) -> bytes:
        buf, self._buf = self._buf, b""
        return self._re.sub(b"[REDACTED]", buf)


def bodies(size: int) -> dict[str, bytes]:
    rec = json.dumps(
        {
            "id": 12345,
            "name": "item description text",
            "url": "https://example.com/a%20b?x=1&y=2",
            "path": "C:\\dir\\file",
            "n": 3.14159,
        }
    ).encode()
    js = (rec + b"\n") * (size // (len(rec) + 1))
    php = json.dumps({"u": "https://a.example/x/y/z", "t": "caf\u00e9"}).replace("/", "\\/")
    php_b = (php.encode() + b"\n") * (size // (len(php) + 1))
    echo = bytearray(js)
    shown = json.dumps(TOKEN.decode()).replace("/", "\\/").encode()
    for at in range(0, len(echo) - 100, 1 << 20):
        echo[at : at + len(shown)] = shown
    mime = bytearray(base64.encodebytes(os.urandom(size * 3 // 4)).replace(b"\n", b"\r\n"))
    for at in range(0, len(mime) - 200, 1 << 20):
        line = at - at % 78 + 60  # 16 characters before a CRLF
        wrapped = base64.b64encode(b"xyz" + TOKEN)
        mime[line : line + len(wrapped) + 2] = wrapped[:16] + b"\r\n" + wrapped[16:]
    form = base64.b64encode(TOKEN)
    pieces = b"\n".join(form[i : i + 24] for i in range(0, len(form), 24)) + b"\n"
    lines = b"".join(b"%07d line of a large loopback response.......\n" % i for i in range(20000))
    return {
        "lines": (lines * (size // len(lines) + 1))[:size],
        "json": js,
        "random": os.urandom(size),
        "php_json": php_b,
        "echo": bytes(echo),
        "mime": bytes(mime),
        "pieces": pieces * (size // len(pieces)),
    }


CLOCK = time.perf_counter
"""What ``run`` times with (``--cpu``: ``time.process_time``)."""


def run(make: Callable[[], object], body: bytes) -> float:
    r: Any = make()
    t = CLOCK()
    for i in range(0, len(body), CHUNK):
        r.feed(body[i : i + CHUNK])
    r.flush()
    return CLOCK() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ab", type=Path, help="also time the Redactor of this checkout")
    ap.add_argument("--cpu", action="store_true", help="time bodies in process CPU seconds")
    args = ap.parse_args()
    global CLOCK
    if args.cpu:
        CLOCK = time.process_time
    other: Any = _load_redaction(args.ab) if args.ab else None
    secrets = (TOKEN, b"Bearer " + TOKEN)
    redaction.clear_plans()
    t = time.perf_counter()
    r = Redactor(secrets)
    built = time.perf_counter() - t
    t = time.perf_counter()
    assert r._plan is not None
    r._plan.pattern  # noqa: B018 - compile now, to time it
    compiled = time.perf_counter() - t
    print(
        f"new credential: plan {built * 1000:.0f} ms, pattern compiled on first use "
        f"{compiled * 1000:.0f} ms"
    )
    if other:
        other.clear_plans()
        t = time.perf_counter()
        other.Redactor(secrets)._plan.pattern  # noqa: B018 - compile now, to time it
        print(f"  @ {args.ab.name}: plan and pattern {(time.perf_counter() - t) * 1000:.0f} ms")
    ab = f" {'Redactor @' + args.ab.name:>22}" if other else ""
    print(f"{'body':10} {'literal (old)':>14} {'Redactor':>10} {'time new/old':>13}{ab}")
    for name, body in bodies(args.mib << 20).items():
        old = new = then = float("inf")
        for _ in range(args.repeat):  # interleaved rounds, best of each
            old = min(old, run(lambda: LiteralRedactor(secrets), body))
            new = min(new, run(lambda: Redactor(secrets), body))
            if other:
                then = min(then, run(lambda: other.Redactor(secrets), body))
        mib = len(body) / 2**20
        line = f"{name:10} {mib / old:>9.0f} MiB/s {mib / new:>5.0f} MiB/s {new / old:>12.2f}"
        print(line + (f" {mib / then:>16.0f} MiB/s" if other else ""))


def _load_redaction(src: Path) -> Any:
    """``affidavit/secrets/redaction.py`` of another checkout, its package loaded as a package
    of its own (``redaction_ab``): the module imports its siblings (``redaction_forms``...)."""
    import importlib
    import importlib.util

    pkg = src / "affidavit" / "secrets"
    spec = importlib.util.spec_from_file_location(
        "redaction_ab", pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["redaction_ab"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("redaction_ab.redaction")


if __name__ == "__main__":
    main()
