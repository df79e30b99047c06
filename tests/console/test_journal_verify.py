"""The console's journal page keeps its verify (issue 15: it ran a whole verify per request):
the first request verifies the whole journal, later ones check only the rows appended since
(``KeptVerify``, ``JournalReader.verify_since``) and say so -- when the whole verify ran, how
far it reached, how far the rows after it were checked; a row altered in the new rows is
reported on the next request, and one altered before is found by the page's whole verify
(its button), never claimed checked by the extension.

The console is served in this process as the daemon serves it (a real loopback socket)."""

from __future__ import annotations

import http.client
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from affidavit.console.verified import KeptVerify
from affidavit.journal import JournalReader
from tests.broker.helpers import http_target, open_broker
from tests.http.hostile import HostileServer, Reply, scripts

from .kit import get, log_in_to, operator_config, post, read_in_threads, served, settled


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    calls = {"verify": 0, "verify_since": 0}
    for name in calls:
        real = getattr(JournalReader, name)

        def spy(self: JournalReader, *a: Any, _real: Any = real, _n: str = name, **k: Any) -> Any:
            calls[_n] += 1
            return _real(self, *a, **k)

        monkeypatch.setattr(JournalReader, name, spy)
    return calls


def _alter(db: Path, seq: int) -> None:
    """Change a stored row in place, as someone who can write the file (triggers dropped):
    its time, which the views fold as they find it, so only a verify can tell."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute("UPDATE events SET at = at + 1 WHERE seq = ?", (seq,))
    finally:
        conn.close()


def _verify_line(page: bytes) -> str:
    m = re.search(rb'id="verify">([^<]*)<', page)
    assert m is not None, page[:2000]
    return m.group(1).decode()


async def test_the_journal_page_extends_its_verify_and_verifies_whole_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    db = tmp_path / "journal.db"
    refused = {"target": "nope", "method": "GET", "path": "/"}
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        await b.call(refused)
        calls = _counting(monkeypatch)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert calls == {"verify": 1, "verify_since": 0}  # nothing kept: the whole journal
        whole = b.journal.head()[0]
        assert _verify_line(page).startswith(f"intact: {whole} events")
        assert f"verified through seq {whole} (started " in page.decode()
        # No anchor: the page claims nothing of the journal's end (a tail cut to a checkpoint).
        assert b'id="complete">not proven (no anchor): rows after any checkpoint' in page

        await b.call(refused)
        await b.call(refused)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert calls == {"verify": 1, "verify_since": 1}  # the new rows only
        head = b.journal.head()[0]
        text = page.decode()
        assert _verify_line(page).startswith(f"intact: {head} events")
        assert f"verified through seq {whole} (started " in text and ", finished " in text
        assert "checked as they were appended (chain" in text
        assert "the last check at" in text and f"through seq {head}." in text
        assert "not read again until a whole verify" in text

        # A row the whole verify read, altered since: not read again -- the page does not
        # claim it checked it, and its whole verify finds it.
        _alter(db, 2)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert _verify_line(page).startswith("intact") and calls["verify"] == 1
        status, headers, body = await post(
            f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        )
        # Post/Redirect/Get: the answer is no page a reload would post again.
        assert (status, headers["location"], body) == (303, "/journal", b"")
        await settled(console)
        assert calls["verify"] == 2
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert _verify_line(page).startswith("BROKEN at seq 2 (ROW_ALTERED): row 2 was altered")
        # Broken: kept as it is, with when it ran; not read past.
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert _verify_line(page).startswith("BROKEN at seq 2") and calls["verify"] == 2


async def test_a_new_row_altered_is_reported_by_the_next_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    refused = {"target": "nope", "method": "GET", "path": "/"}
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        await b.call(refused)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        whole = b.journal.head()[0]
        await b.call(refused)
        _alter(tmp_path / "journal.db", whole + 1)
        for _ in range(2):  # reported while it is there, request after request
            _, _, page = await get(f"{origin}/journal", cookie=cookie)
            assert _verify_line(page).startswith(
                f"BROKEN at seq {whole + 1} (ROW_ALTERED): row {whole + 1} was altered"
            )
            # The rows before it were not read again: intact as of their check, not now.
            assert _verify_line(page).endswith(
                f"({whole} events before it are intact as of their last check: "
                f"seq {whole + 1} on read now)"
            ), _verify_line(page)
        status, _, _ = await post(
            f"{origin}/journal/verify", {"csrf": "wrong"}, {"Origin": origin, "Cookie": cookie}
        )
        assert status == 403  # the whole verify is the operator's, CSRF-checked
        status, _, _ = await post(
            f"{origin}/journal/verify",
            {"csrf": csrf, "x": "1"},
            {"Origin": origin, "Cookie": cookie},
        )
        assert status == 400


async def test_a_whole_verify_that_finds_a_row_altered_has_the_kept_views_read_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept sessions view does not read again a row it folded; a whole verify that finds
    one altered has it fold the journal again, meeting the altered row as a full fold does --
    and the page still shows the verify, with why the sessions cannot be read."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    refused = {"target": "nope", "method": "GET", "path": "/", "session": "s1"}
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        await b.call(refused)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert b'href="/actions?session=s1"' in page
        conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
        try:
            conn.execute("DROP TRIGGER IF EXISTS events_no_update")
            conn.execute("UPDATE events SET attrs = '[1]' WHERE seq = 1")
        finally:
            conn.close()
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert b'href="/actions?session=s1"' in page  # kept: not read again (the page says so)
        status, _, _ = await post(
            f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        )
        assert status == 303
        await settled(console)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert _verify_line(page).startswith("BROKEN at seq 1")
        m = re.search(rb'id="sessions-error">([^<]*)<', page)
        assert m is not None and b"altered" in m.group(1), page[-1500:]
        assert b'href="/actions?session=s1"' not in page


async def test_a_row_an_earlier_extension_checked_is_not_claimed_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each extension reads only the rows after the previous one's: a row an earlier visit
    checked, altered since, is not read again -- the page says the rows through it are as of
    their last check (not only those of the whole verify), and its whole verify finds it."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    refused = {"target": "nope", "method": "GET", "path": "/"}
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, csrf = await log_in_to(console, origin)
        await b.call(refused)
        await get(f"{origin}/journal", cookie=cookie)
        whole = b.journal.head()[0]
        await b.call(refused)
        await get(f"{origin}/journal", cookie=cookie)  # checks whole+1..first
        first = b.journal.head()[0]
        _alter(tmp_path / "journal.db", whole + 1)
        await b.call(refused)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        text = page.decode()
        assert _verify_line(page).startswith("intact")  # not read again: as of its check
        assert f"Rows up to seq {first}, and the stored results" in text, text[-2500:]
        assert f"seq {whole + 1}..{first} were checked by earlier visits" in text
        assert f"Rows up to seq {whole}," not in text
        await post(f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie})
        await settled(console)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert _verify_line(page).startswith(f"BROKEN at seq {whole + 1}")


async def test_a_result_stored_after_the_whole_verify_is_checked_by_the_next_visit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An extension checks the results the new rows commit against their chained hashes, as a
    whole verify does -- not the idempotency keys they bind, which the verdict says (not
    "intact" alone); a stored result altered after it was committed is reported BROKEN."""
    async with HostileServer.running(scripts.serve(Reply(200, body=b"stored"))) as srv:
        path = operator_config(tmp_path, monkeypatch, {"api": http_target(srv.url)})
        async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
            cookie, _csrf = await log_in_to(console, origin)
            await b.call({"target": "nope", "method": "GET", "path": "/"})
            await get(f"{origin}/journal", cookie=cookie)
            whole = b.journal.head()[0]
            env = await b.call({"target": "api", "method": "GET", "path": "/r"})
            assert "error" not in env, env
            _, _, page = await get(f"{origin}/journal", cookie=cookie)
            line = _verify_line(page)
            assert line.startswith("intact") and "as of their last check" in line, line
            assert f"after seq {whole} the chain, signed checkpoints and the 1 stored" in line
            # Nor the lease rows: verify holds them to their events, an extension does not.
            assert "idempotency keys they bind and their lease rows are not checked" in line, line
            await b.call({"target": "api", "method": "GET", "path": "/s"})
            conn = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
            try:
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'"):
                    conn.execute(f'DROP TRIGGER "{name}"')
                bad = conn.execute("SELECT max(seq) FROM results").fetchone()[0]
                conn.execute("UPDATE results SET sha256 = ? WHERE seq = ?", ("0" * 64, bad))
            finally:
                conn.close()
            _, _, page = await get(f"{origin}/journal", cookie=cookie)
            line = _verify_line(page)
            assert line.startswith(
                f"BROKEN at seq {bad} (MARKER_DIFFERS): stored result of invocation"
            ), line


async def test_presses_queued_while_a_whole_verify_runs_cost_one_more_not_one_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator pressing 'Verify the whole journal now' again and again (41 s each at 1M
    events) while one runs: the requests take turns (the daemon reads in worker threads), and
    a whole verify begun after a request came answers it -- three presses during one verify
    run one more, not three."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b:
        await b.call({"target": "nope", "method": "GET", "path": "/"})
    kept = KeptVerify()
    calls = _counting(monkeypatch)
    real = JournalReader.verify  # (the counting spy)
    running, go = threading.Event(), threading.Event()

    def slow(self: JournalReader, *a: Any, **k: Any) -> Any:
        running.set()
        assert go.wait(10.0)  # bounded
        return real(self, *a, **k)

    monkeypatch.setattr(JournalReader, "verify", slow)
    answers: list[dict[str, Any]] = []

    def press() -> None:
        with JournalReader.open(tmp_path / "journal.db") as reader:
            answers.append(kept.page(reader, whole=True))

    first = threading.Thread(target=press)
    first.start()
    assert running.wait(10.0)
    more = [threading.Thread(target=press) for _ in range(3)]  # pressed again while it runs
    for t in more:
        t.start()
    time.sleep(0.3)  # (they have come in and wait their turn)
    go.set()
    for t in [first, *more]:
        t.join(10.0)
        assert not t.is_alive()
    assert len(answers) == 4 and all(a["report"]["ok"] for a in answers)
    assert calls["verify"] == 2, calls


async def test_a_visit_while_a_whole_verify_runs_is_answered_at_once_with_the_last_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole verify takes ~41 s at 1M events: a visit meanwhile does not hold a thread for
    it -- it is answered at once with the last report and since when the whole verify runs
    (before the first report: that there is none yet).  The console reads in worker threads,
    as the daemon serves it."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    db = tmp_path / "journal.db"

    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        read_in_threads(console, db)
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        real = JournalReader.verify
        running, go = threading.Event(), threading.Event()

        def slow(self: JournalReader, *a: Any, **k: Any) -> Any:
            running.set()
            assert go.wait(10.0)  # bounded
            return real(self, *a, **k)

        monkeypatch.setattr(JournalReader, "verify", slow)
        pages: list[bytes] = []
        pressed: list[int] = []

        async def press() -> None:
            status, _, _ = await post(
                f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
            )
            pressed.append(status)

        late: list[bool] = []

        async def visit(nursery: trio.Nursery) -> None:
            """A visit while the whole verify is held; then the verify goes on."""
            while not running.is_set():
                await trio.sleep(0.01)
            answered = trio.Event()

            async def fetch() -> None:
                pages.append((await get(f"{origin}/journal", cookie=cookie))[2])
                answered.set()

            nursery.start_soon(fetch)
            with trio.move_on_after(3.0):  # (held for the verify: not answered in time)
                await answered.wait()
            late.append(not answered.is_set())
            go.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(press)
            await visit(nursery)  # the first: nothing kept yet
        await settled(console)
        assert late == [False] and b'id="verify-running"' in pages[0], pages
        assert b"no report yet" in pages[0]
        running.clear()
        go.clear()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(press)
            await visit(nursery)  # a report is kept now: it is shown
        await settled(console)
        assert late == [False, False] and b'id="verify-running"' in pages[1], pages
        assert _verify_line(pages[1]).startswith("intact"), pages[1][-2000:]
        assert pressed == [303, 303]
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert b'id="verify-running"' not in page and _verify_line(page).startswith("intact")


async def test_presses_while_a_whole_verify_runs_join_it_and_hold_no_view_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator presses 'Verify the whole journal now' as many times as the daemon has view
    threads while one runs: the later presses join the running verify (one verify in all, each
    press answered 303 -- a joined one at once: test_verify_joined.py), and the journal and
    actions pages are answered meanwhile -- a press that waited its turn in a view thread took
    one each, and with every view thread held the views stalled until the verify ended.  The
    console reads in worker threads through the daemon's limiter (``VIEW_THREADS``)."""
    from affidavit.daemon.app import VIEW_THREADS

    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    db = tmp_path / "journal.db"
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        read_in_threads(console, db, limiter=trio.CapacityLimiter(VIEW_THREADS))
        cookie, csrf = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        _, _, page = await get(f"{origin}/journal", cookie=cookie)  # a report kept
        assert _verify_line(page).startswith("intact")
        calls = _counting(monkeypatch)
        real = JournalReader.verify  # (the counting spy)
        running, go = threading.Event(), threading.Event()

        def slow(self: JournalReader, *a: Any, **k: Any) -> Any:
            running.set()
            assert go.wait(20.0)  # bounded
            return real(self, *a, **k)

        monkeypatch.setattr(JournalReader, "verify", slow)
        pressed: list[int] = []
        seen: dict[str, bytes] = {}

        async def press() -> None:
            status, headers, _ = await post(
                f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
            )
            assert headers.get("location") == "/journal", headers
            pressed.append(status)

        async def visit(name: str) -> None:
            def run() -> bytes:  # (abandoned when not answered in time: see below)
                conn = http.client.HTTPConnection(origin.removeprefix("http://"), timeout=20)
                try:
                    conn.request("GET", f"/{name}", headers={"Cookie": cookie})
                    return conn.getresponse().read()
                finally:
                    conn.close()

            seen[name] = await trio.to_thread.run_sync(run, abandon_on_cancel=True)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(press)
            while not running.is_set():
                await trio.sleep(0.01)
            for _ in range(VIEW_THREADS):  # pressed again and again while it runs
                nursery.start_soon(press)
            await trio.sleep(0.3)  # (they have come in)
            with trio.move_on_after(5.0):  # views answered while the verify is held
                async with trio.open_nursery() as views:
                    views.start_soon(visit, "journal")
                    views.start_soon(visit, "actions")
            answered = sorted(seen)
            go.set()
        await settled(console)
        assert answered == ["actions", "journal"], answered
        assert b'id="verify-running"' in seen["journal"], seen["journal"][-2000:]
        assert pressed == [303] * (VIEW_THREADS + 1)
        assert calls["verify"] == 1, calls  # one verify for every press
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        assert b'id="verify-running"' not in page and _verify_line(page).startswith("intact")


def _as_of(page: bytes, id: str) -> str:
    m = re.search(rf'id="{id}">([^<]*)<'.encode(), page)
    assert m is not None, page[-3000:]
    return " ".join(m.group(1).decode().split())


async def test_the_kept_views_say_the_seq_they_folded_and_the_last_whole_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unfiltered actions counts and the journal page's sessions are kept (folded as rows
    are appended, a row not read again): each says the last seq folded into it, and when the
    last whole verify completed, through which seq and its verdict -- moving as rows are
    appended and as a whole verify completes.  A filtered page is folded now: no marker."""
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    refused = {"target": "nope", "method": "GET", "path": "/"}
    now = [1_700_000_000.0]  # 2023-11-14 22:13:20 UTC
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        console.verified = KeptVerify(console.summary, clock=lambda: now[0])
        cookie, csrf = await log_in_to(console, origin)
        await b.call(refused)
        _, _, page = await get(f"{origin}/actions", cookie=cookie)
        first = b.journal.head()[0]
        line = _as_of(page, "counts-as-of")
        assert line.startswith(f"Kept: folded through seq {first} (each row read once"), line
        assert line.endswith("No whole verify has completed since the daemon started."), line

        await b.call(refused)
        _, _, page = await get(f"{origin}/journal", cookie=cookie)  # (nothing kept: verified)
        second = b.journal.head()[0]
        assert second > first
        line = _as_of(page, "sessions-as-of")
        assert line.startswith(f"Kept: folded through seq {second} "), line
        assert line.endswith(
            f"intact, verified through seq {second} (started 2023-11-14 22:13:20 UTC, finished "
            "2023-11-14 22:13:20 UTC; the rows as they were when it started reading)."
        ), line

        await b.call(refused)  # appended: the counts move, the verify does not
        now[0] += 60.0
        _, _, page = await get(f"{origin}/actions", cookie=cookie)
        third = b.journal.head()[0]
        assert third > second
        line = _as_of(page, "counts-as-of")
        assert line.startswith(f"Kept: folded through seq {third} "), line
        assert f"verified through seq {second} (started 2023-11-14 22:13:20 UTC," in line, line
        _, _, page = await get(f"{origin}/actions?outcome=rejected", cookie=cookie)
        assert b'id="counts-as-of"' not in page  # folded now, not kept

        status, _, _ = await post(
            f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie}
        )
        assert status == 303
        await settled(console)
        for where, id in (("actions", "counts-as-of"), ("journal", "sessions-as-of")):
            _, _, page = await get(f"{origin}/{where}", cookie=cookie)
            line = _as_of(page, id)
            assert line.startswith(f"Kept: folded through seq {third} "), (where, line)
            assert f"verified through seq {third} (started 2023-11-14 22:14:20 UTC," in line, (
                where,
                line,
            )

        _alter(tmp_path / "journal.db", 2)  # found by the next whole verify: folded again
        now[0] += 60.0
        await post(f"{origin}/journal/verify", {"csrf": csrf}, {"Origin": origin, "Cookie": cookie})
        await settled(console)
        _, _, page = await get(f"{origin}/actions", cookie=cookie)
        line = _as_of(page, "counts-as-of")
        assert line.startswith(f"Kept: folded through seq {third} "), line
        assert line.endswith(
            "22:15:20 UTC): BROKEN after seq 1 (the kept views were folded again from the "
            "journal as it is)."
        ), line


async def test_a_broken_verify_s_reason_renders_its_controls_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """audit51b item 5: the reason of a BROKEN verify quotes what it found (an id, a field of
    the journal): a bidi override or control character in it is shown as its escape, never
    raw -- the page's other journal text goes through the same ``visible`` filter."""
    import dataclasses

    real = JournalReader.verify

    def broken(self: JournalReader, *a: Any, **k: Any) -> Any:
        report = real(self, *a, **k)
        return dataclasses.replace(
            report, ok=False, first_bad_seq=1, reason="row 1 \u202eni\x1b[2J altered"
        )

    monkeypatch.setattr(JournalReader, "verify", broken)
    path = operator_config(tmp_path, monkeypatch, {"pay": http_target("http://127.0.0.1:9")})
    async with open_broker(path) as b, served(b, tmp_path) as (origin, console):
        cookie, _ = await log_in_to(console, origin)
        await b.call({"target": "nope", "method": "GET", "path": "/"})
        _, _, page = await get(f"{origin}/journal", cookie=cookie)
        text = page.decode()
        assert "\u202e" not in text and "\x1b" not in text
        m = re.search(r'id="verify">(.*?)</p>', text, re.S)
        assert m is not None, text[:2000]
        assert "BROKEN at seq 1" in m.group(1)
        assert '<span class="ctl" title="U+202E">\\u202e</span>' in m.group(1), m.group(1)
