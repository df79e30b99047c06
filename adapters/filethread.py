"""The worker threads that stat and read the files the broker re-reads when they move (a CA file,
the config file: adapters/filestat.py), apart from trio's default thread limiter, and at most
one per path at a time.

A stat or read on a hung network mount blocks its thread until the mount answers -- possibly
never.  Its caller gives up at its own deadline, but the thread runs on, and through trio's
``to_thread.run_sync`` it would keep a token of the process's one default limiter (40) until it
ends: forty calls that gave up on one hung CA file and every other thread hop in the process
(another target's healthy CA file, the dispatch gate's config re-read, the MCP transport's large
lines, the daemon's journal reads) waits for a token.  So here:

- the threads take their tokens from a limiter of their own (``FILE_THREADS`` per ``trio.run``),
  never the default one;
- at most one thread per path is in flight (``off_loop``'s ``paths``): a later caller for a path
  in flight waits for that thread's end under its own deadline -- and takes its result when it
  asked for the same work (``key``), else starts its own once the path is free -- so a hung path
  pins one thread, not one per call;
- no task owns a thread (``trio.lowlevel.start_thread_soon``): a caller that gives up leaves it
  to end on its own, its token given back, its result handed to whoever still waits.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import trio

__all__ = ["FILE_THREADS", "off_loop"]

T = TypeVar("T")

FILE_THREADS = 8
"""Threads stating or reading files at once, per ``trio.run``: each distinct path a hung mount
holds pins one, until it answers."""

_STATE: trio.lowlevel.RunVar[_State] = trio.lowlevel.RunVar("affidavit_file_threads")


class _Flight:
    """One thread's work: ``key``, the ``paths`` it stats or reads, and, once ``done``, its
    ``value`` or ``error`` (``started`` False: its caller gave up before it had a thread)."""

    __slots__ = ("done", "error", "key", "paths", "started", "value")

    def __init__(self, key: Hashable, paths: tuple[str, ...]) -> None:
        self.key, self.paths = key, paths
        self.done = trio.Event()
        self.started = False
        self.value: Any = None
        self.error: BaseException | None = None


class _State:
    def __init__(self) -> None:
        self.limiter = trio.CapacityLimiter(FILE_THREADS)
        self.flights: dict[Hashable, _Flight] = {}
        self.busy: dict[str, _Flight] = {}
        self.token = trio.lowlevel.current_trio_token()


def _state() -> _State:
    try:
        return _STATE.get()
    except LookupError:
        state = _State()
        _STATE.set(state)
        return state


async def off_loop(
    key: Hashable, paths: Iterable[str | os.PathLike[str]], fn: Callable[[], T]
) -> T:
    """``fn()`` -- a stat or read of ``paths`` -- in a file thread, its result shared by every
    caller of the same ``key`` while it runs.  Cancellable at any point (the thread, once
    started, runs on); ``fn``'s exception is raised to each caller."""
    state = _state()
    wanted = tuple(os.fspath(p) for p in paths)
    while True:
        flight = state.flights.get(key)
        if flight is None:
            flight = next((state.busy[p] for p in wanted if p in state.busy), None)
            if flight is None:
                flight = await _start(state, key, wanted, fn)
            else:
                await flight.done.wait()  # another work on one of the paths: its end first
                continue
        await flight.done.wait()
        if flight.key != key or not flight.started:
            continue  # (its caller gave up before its thread started: ours, then)
        if flight.error is not None:
            raise flight.error
        return flight.value  # type: ignore[no-any-return]


async def _start(
    state: _State, key: Hashable, paths: tuple[str, ...], fn: Callable[[], T]
) -> _Flight:
    flight = _Flight(key, paths)
    state.flights[key] = flight
    for p in paths:
        state.busy[p] = flight
    try:
        await state.limiter.acquire_on_behalf_of(flight)
    except BaseException:
        _land(state, flight)
        raise
    flight.started = True

    def deliver(result: Any) -> None:  # in the thread, after ``fn``
        with contextlib.suppress(trio.RunFinishedError):  # the run is over: nobody waits
            state.token.run_sync_soon(_finish, state, flight, result)

    trio.lowlevel.start_thread_soon(fn, deliver, name="affidavit file thread")
    return flight


def _finish(state: _State, flight: _Flight, result: Any) -> None:
    state.limiter.release_on_behalf_of(flight)
    try:
        flight.value = result.unwrap()
    except BaseException as exc:  # handed to each waiter
        flight.error = exc
    _land(state, flight)


def _land(state: _State, flight: _Flight) -> None:
    if state.flights.get(flight.key) is flight:
        del state.flights[flight.key]
    for p in flight.paths:
        if state.busy.get(p) is flight:
            del state.busy[p]
    flight.done.set()
