"""The dispatch gate's re-check of the config file (seed: "re-check it immediately before the
write") sees every edit, including one that keeps the file's size and mtime.

``cp -p``, ``rsync -t``, ``install -p`` and ``touch -r`` put the old mtime back, and a rename
over the file may bring one along: keyed on (mtime, size) alone the running broker went on
dispatching under the config it started with.  The key is the file's identity as the kernel
keeps it (``affidavit.adapters.filestat.stat_key``: device, inode, ctime, mtime, size); a read
taken in the tick of the file's last change vouches for nothing (``SETTLED_NS``), and the read
itself is bounded (``affidavit.config.read_config``).
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

import affidavit.engine.snapshot as snapshot_module
from affidavit.config import ConfigError, load_config
from affidavit.config.loader import MAX_CONFIG_BYTES
from affidavit.engine.snapshot import ConfigSnapshot
from affidavit.journal import JournalReader
from tests.http.hostile import HostileServer, Reply, make_tls, scripts

from .helpers import assert_error, http_target, open_broker, write_config

URL = "http://127.0.0.1:9/"
LIMIT = 20


def _snapshot(tmp_path: Path) -> tuple[Path, ConfigSnapshot, str]:
    path = write_config(tmp_path, {"api": http_target(URL + "aaaa/")})
    snap = ConfigSnapshot(load_config(path), lambda purpose, data: f"{purpose}:{data.hex()}")
    return path, snap, snap.hash(snap.config.targets["api"])


def _edited(path: Path) -> str:
    """The config with the target's URL changed, the file's length kept."""
    text = path.read_text()
    edited = text.replace("aaaa/", "bbbb/")
    assert edited != text and len(edited) == len(text)
    return edited


def _in_place(path: Path) -> None:
    st = os.stat(path)
    with path.open("r+") as f:  # the same inode, written over, mtime put back
        f.write(_edited(path))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _renamed_over(path: Path) -> None:
    st = os.stat(path)
    new = path.with_name("new.toml")  # made as `cp -p` makes it, then renamed over
    new.write_text(_edited(path))
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, path)


@pytest.mark.parametrize("edit", [_in_place, _renamed_over], ids=["in_place", "renamed_over"])
async def test_a_same_size_edit_with_the_old_mtime_is_seen_by_its_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: Callable[[Path], None]
) -> None:
    """With every read trusted at once (``SETTLED_NS`` 0), the stat alone must show the edit:
    size and mtime are as before, the ctime (or the inode) is not."""
    monkeypatch.setattr(snapshot_module, "SETTLED_NS", 0)
    path, snap, bound = _snapshot(tmp_path)
    assert not await snap.changed("api", bound)
    await trio.sleep(0.05)  # past any timestamp tick: the edit's ctime is another one
    before = os.stat(path)
    edit(path)
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert await snap.changed("api", bound)


async def test_a_read_in_the_tick_of_the_last_change_is_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system whose clock did not tick between the read and a same-size write in place
    (the stat reads the same as the read's): the read just after the file's last change vouches
    for nothing, so the next dispatch reads the bytes again and sees the edit."""
    path, snap, bound = _snapshot(tmp_path)
    assert not await snap.changed("api", bound)
    seen = snap._seen
    assert seen is not None and not seen.settled
    monkeypatch.setattr(snapshot_module, "_stat_key", lambda _path: seen.key)
    with path.open("r+") as f:
        f.write(_edited(path))
    assert await snap.changed("api", bound)


async def test_a_fresh_file_is_read_per_dispatch_but_parsed_once_and_a_settled_one_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the re-check costs: while the file's last change is recent, every dispatch reads
    and digests it -- parsing it never while its bytes are those the config was parsed from
    (``Config.source_digest``); once a read is settled, a stat per dispatch."""
    reads: list[Path] = []
    parses: list[Path] = []
    real_read, real_parse = snapshot_module.read_config, snapshot_module.parse_config

    def counting_read(p: Path) -> Any:
        reads.append(p)
        return real_read(p)

    def counting_parse(raw: bytes, p: Path) -> Any:
        parses.append(p)
        return real_parse(raw, p)

    monkeypatch.setattr(snapshot_module, "read_config", counting_read)
    monkeypatch.setattr(snapshot_module, "parse_config", counting_parse)
    path, snap, bound = _snapshot(tmp_path)
    assert [await snap.changed("api", bound) for _ in range(4)] == [False] * 4
    assert (len(reads), len(parses)) == (4, 0)
    monkeypatch.setattr(snapshot_module, "SETTLED_NS", 0)
    assert [await snap.changed("api", bound) for _ in range(4)] == [False] * 4
    assert (len(reads), len(parses)) == (5, 0)  # the one read that settled it
    path.write_text(_edited(path))  # another content: parsed once, then known by its digest
    assert [await snap.changed("api", bound) for _ in range(2)] == [True] * 2
    assert (len(reads), len(parses)) == (6, 1)


async def test_a_file_the_config_names_removed_is_not_an_edit_of_the_config(
    tmp_path: Path,
) -> None:
    """The first re-check reads the file the config was loaded from: the same bytes are that
    config, not parsed again -- a parse judges the files the config names too, so a CA file of
    another target removed since the start made every target CONFIG_CHANGED."""
    ca = Path(make_tls(tmp_path).ca_file)
    tls = {**http_target("https://127.0.0.1:9/"), "ca_file": str(ca)}
    path = write_config(tmp_path, {"api": http_target(URL), "tls": tls})
    snap = ConfigSnapshot(load_config(path), lambda purpose, data: f"{purpose}:{data.hex()}")
    bound = snap.hash(snap.config.targets["api"])
    ca.unlink()
    with pytest.raises(ConfigError):
        load_config(path)  # (the file as it is now does not load: the CA file is gone)
    assert not await snap.changed("api", bound)


@pytest.mark.parametrize("kind", ["fifo", "oversize"])
async def test_a_config_replaced_by_a_fifo_or_a_huge_file_is_changed_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    """The reload reads through ``read_small_file``: a FIFO is refused at once (no writer is
    waited for), a file past ``MAX_CONFIG_BYTES`` is not read into memory -- the target counts
    as changed, and a start is refused CONFIG_UNREADABLE naming the file."""
    path, snap, bound = _snapshot(tmp_path)
    assert not await snap.changed("api", bound)
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        with path.open("wb") as f:
            f.truncate(MAX_CONFIG_BYTES + 1)
    with trio.fail_after(LIMIT):
        assert await snap.changed("api", bound)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.code == "CONFIG_UNREADABLE"
    assert caught.value.file == str(path)


async def test_a_call_after_a_same_size_same_mtime_replacement_is_config_changed(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: a call goes out under the config (its read trusted at once: ``SETTLED_NS``
    0), which is then replaced by a same-size copy carrying the old mtime; the next call is
    refused and the server receives nothing more."""
    monkeypatch.setattr(snapshot_module, "SETTLED_NS", 0)
    call = {"target": "api", "method": "GET", "path": "/x"}
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url + "/aaaa/")})
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                first = await b.call(call)
            assert first.get("error") is None, first
            await trio.sleep(0.05)  # past any timestamp tick, as above
            _renamed_over(cfg)
            with trio.fail_after(LIMIT):
                env = await b.call(call)
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="CONFIG_CHANGED",
            )
            assert env["error"]["field"] == "targets.api"
    assert len(srv.requests) == 1


def _nested_too_deeply(path: Path) -> None:
    """``zz = [[[[...`` 100,000 deep: ~100 KB, well under ``MAX_CONFIG_BYTES``, and past
    ``tomllib``'s recursion (a RecursionError, not a TOMLDecodeError)."""
    path.write_text(path.read_text() + "\nzz = " + "[" * 100_000 + "\n")
    assert path.stat().st_size < MAX_CONFIG_BYTES


def test_a_config_nested_too_deeply_is_invalid_toml(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"api": http_target(URL)})
    _nested_too_deeply(path)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert (caught.value.code, caught.value.field) == ("CONFIG_INVALID", "")
    assert "invalid TOML: nested too deeply" in str(caught.value)


def test_a_config_file_whose_close_fails_is_unreadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_small_file`` closes what it read; a close that fails (EIO on a network file
    system) is its coded refusal, not a bare OSError out of the loader."""
    path = write_config(tmp_path, {"api": http_target(URL)})
    real = os.close

    def close(fd: int) -> None:
        real(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "close", close)
    try:
        with pytest.raises(ConfigError) as caught:
            load_config(path)
    finally:
        monkeypatch.undo()
    assert caught.value.code == "CONFIG_UNREADABLE"
    assert "cannot close file (Input/output error)" in str(caught.value)


async def test_a_call_after_the_config_nests_too_deeply_is_config_changed(
    tmp_path: Path, token: str
) -> None:
    """The dispatch gate's reread meets the deep config: the call is CONFIG_CHANGED, fix the
    config (after_correction), nothing sent -- it was SETUP_FAILED at connection_setup, to be
    retried with backoff, as the RecursionError left the reread."""
    call = {"target": "api", "method": "GET", "path": "/x"}
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url + "/aaaa/")})
        async with open_broker(cfg) as b:
            with trio.fail_after(LIMIT):
                first = await b.call(call)
            assert first.get("error") is None, first
            _nested_too_deeply(cfg)
            with trio.fail_after(LIMIT):
                env = await b.call(call)
            assert_error(
                b,
                env,
                phase="validation",
                outcome="not_attempted",
                retry="after_correction",
                code="CONFIG_CHANGED",
            )
    assert len(srv.requests) == 1


@pytest.mark.parametrize("step", ["read_config", "parse_config"])
async def test_any_failure_to_get_a_valid_config_counts_as_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Not only the loader's ConfigError: whatever else the reread or the parse raises (an
    OSError, a RecursionError the loader did not foresee) is "no valid config", not an error
    out of the dispatch gate."""
    path, snap, bound = _snapshot(tmp_path)
    assert not await snap.changed("api", bound)
    path.write_text(_edited(path).replace("bbbb/", "aaaa/") + "\n")  # bytes moved: parsed again

    def fails(*args: Any) -> Any:
        raise (
            RecursionError("maximum recursion depth exceeded")
            if step == "parse_config"
            else (OSError(errno.EIO, "Input/output error"))
        )

    monkeypatch.setattr(snapshot_module, step, fails)
    with trio.fail_after(LIMIT):
        assert await snap.changed("api", bound)


async def test_a_reread_that_blocks_holds_neither_the_event_loop_nor_a_cancelled_call(
    tmp_path: Path, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's reread of the config runs in a thread (a hung mount stalls that call, not the
    loop: it keeps running, and another thread hop is made meanwhile), abandoned when the call
    is cancelled: the cancelled call ends at once, not_attempted, nothing sent for it.  (Another
    call's gate would wait for that one read -- one thread per path, adapters/filethread.py --
    and is answered once it lands.)"""
    real = snapshot_module._read
    entered, release = threading.Event(), threading.Event()
    armed = [True]

    def blocking(path: Path, previous: Any) -> Any:
        if armed.pop() if armed else False:  # the first read only
            entered.set()
            release.wait(LIMIT)  # (bounded: a hung test ends)
        return real(path, previous)

    monkeypatch.setattr(snapshot_module, "_read", blocking)
    blocked = {"target": "api", "method": "GET", "path": "/x", "session": "blocked"}
    other = {"target": "api", "method": "GET", "path": "/y", "session": "other"}
    ended: list[Any] = []
    async with HostileServer.running(scripts.serve(Reply(200))) as srv:
        cfg = write_config(tmp_path, {"api": http_target(srv.url + "/aaaa/")})
        async with open_broker(cfg) as b, trio.open_nursery() as nursery:
            scope = trio.CancelScope()
            done = trio.Event()

            async def call_blocked() -> None:
                with scope:
                    ended.append(await b.call(blocked))
                done.set()

            nursery.start_soon(call_blocked)
            try:
                with trio.fail_after(LIMIT):
                    while not entered.is_set():
                        await trio.sleep(0.01)
                    for _ in range(10):  # the loop runs on
                        await trio.sleep(0.01)
                    assert await trio.to_thread.run_sync(lambda: "hop") == "hop"
                assert srv.requests == []
                scope.cancel()
                with trio.fail_after(LIMIT / 2):  # (not the thread's LIMIT: abandoned)
                    await done.wait()
            finally:
                release.set()
            with trio.fail_after(LIMIT):
                env = await b.call(other)
            assert env.get("error") is None, env
    assert ended == []  # cancelled, no envelope
    assert [r.target for r in srv.requests] == ["/aaaa/y"]
    with JournalReader.open(tmp_path / "journal.db") as r:
        (rec,) = r.list_actions(session="blocked")
    assert rec.outcome.value == "not_attempted" and rec.final
