"""The protocol summary's path is run-length encoded and bounded, and still accounts for every
step (affidavit/engine/steps.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from affidavit.engine.echoed import without_received_counts
from affidavit.engine.steps import HEAD_RUNS, TAIL_RUNS, StepPath
from affidavit.statemachine import Event, EventKind
from tests.statemachine.lifecycle_helpers import IID, projector_in


def _path(states: list[str]) -> dict[str, Any]:
    p = StepPath()
    for s in states:
        p.append(s)
    return p.facts()


def test_a_path_without_repeats_reads_as_the_list_of_states() -> None:
    states = ["idle", "dns_resolved", "tcp_connected", "headers_sent", "framing_complete"]
    assert _path(states) == {"path": states, "path_repeats": [], "path_left_out": None}
    assert not StepPath()


def test_a_self_loop_is_one_entry_with_its_count() -> None:
    facts = _path(["headers_sent", "body_sent", "response_headers", *["body"] * 200_000, "end"])
    assert facts == {
        "path": ["headers_sent", "body_sent", "response_headers", "body", "end"],
        "path_repeats": [[3, 200_000]],
        "path_left_out": None,
    }


def test_past_the_bound_the_first_and_last_runs_are_kept_and_the_rest_counted() -> None:
    """SSH's stdout and stderr chunks alternating: no run repeats, every step a new run."""
    states = ["exec_accepted", *["stdout", "stderr"] * 10_000, "stdout", "closed"]
    facts = _path(states)
    path = facts["path"]
    assert len(path) == HEAD_RUNS + TAIL_RUNS
    assert path[:HEAD_RUNS] == states[:HEAD_RUNS] and path[HEAD_RUNS:] == states[-TAIL_RUNS:]
    left = len(states) - HEAD_RUNS - TAIL_RUNS
    assert facts["path_left_out"] == {
        "after": HEAD_RUNS,
        "runs": left,
        "steps": left,
        "states": ["stderr", "stdout"],
    }


def test_a_later_summary_leaves_no_count_of_an_earlier_one_in_the_record() -> None:
    """The record's ``evidence.http`` merges each summary's facts over the last one's: a
    retry's path without repeats, folded after a first attempt's with repeats and runs left
    out, reads as the retry's alone -- not with the first attempt's counts pointing into it."""
    first = _path(["headers_sent", *["body"] * 500, *["a", "b"] * 100, "closed_early"])
    second = _path(["headers_sent", "body", "framing_complete"])
    assert first["path_repeats"] and first["path_left_out"]
    p = projector_in("dispatched")
    for facts in (first, second):
        attrs = {"protocol": "http", "state": "framing_complete", "facts": facts}
        p.apply(Event(EventKind.PROTOCOL_OBSERVED, IID, attrs))
    assert p.record().evidence["http"] == second


def test_a_size_withheld_takes_the_path_s_counts_with_it() -> None:
    """Every output chunk is a step: where the bytes received are withheld (a stream echoed a
    secret), the runs' counts and what was left out would count its chunks -- its size, for
    1-byte chunks.  Which runs repeated stays; every count is null."""
    facts = _path(["headers_sent", "response_headers", *["body"] * 7, "framing_complete"])
    kept = without_received_counts(facts, ["body"])
    assert kept["received_withheld"] == "redacted" and kept["path"] == facts["path"]
    assert kept["path_repeats"] == [[2, None]] and kept["path_left_out"] is None
    assert without_received_counts(facts, []) == facts  # nothing withheld: all kept


@pytest.mark.parametrize("chunks", [2, 10, 31, 32, 100, 5000])
def test_a_withheld_stream_s_chunks_are_not_counted_by_the_path_s_runs(chunks: int) -> None:
    """SSH's stdout and stderr alternating: every chunk is its own run, so the number of runs
    -- and, past 64, whether some were left out -- counted the chunks (1-byte chunks: the
    size).  Withheld, the block of stdout's runs and those between them lists each state once:
    the same path whatever the number of chunks."""
    states = ["exec_accepted", *["stdout", "stderr"] * chunks, "stdout", "exit_status", "closed"]
    kept = without_received_counts(_path(states), ["stdout"])
    assert kept["path"] == ["exec_accepted", "stdout", "stderr", "exit_status", "closed"]
    assert kept["path_repeats"] == [[1, None], [2, None]] and kept["path_left_out"] is None


def test_what_was_left_out_stays_where_it_held_a_state_of_no_withheld_stream() -> None:
    """A state left out that is none of the withheld streams' (nor between their runs) is not
    folded away: the path still says something came there, without its counts."""
    states = ["a", *["b", "c"] * 40, "d", *["b", "c"] * 40, "e"]
    kept = without_received_counts(_path(states), ["b"])
    assert kept["path"] == ["a", "b", "c", "c", "b", "e"]
    assert kept["path_left_out"] == {
        "after": 3,
        "runs": None,
        "steps": None,
        "states": ["b", "c", "d"],
    }


STATES = st.sampled_from(["a", "b", "c"])


@given(st.one_of(st.lists(STATES, max_size=60), st.lists(STATES, min_size=150, max_size=400)))
def test_every_step_is_listed_counted_in_a_run_or_left_out(states: list[str]) -> None:
    facts = _path(states)
    counts = [1] * len(facts["path"])
    for i, n in facts["path_repeats"]:
        assert n > 1
        counts[i] = n
    left = facts["path_left_out"] or {"runs": 0, "steps": 0}
    assert sum(counts) + left["steps"] == len(states)
    assert len(facts["path"]) <= HEAD_RUNS + TAIL_RUNS
    # Expanded, the kept runs are the start and the end of what happened.
    expanded = [s for s, n in zip(facts["path"], counts, strict=True) for _ in range(n)]
    if not left["runs"]:
        assert expanded == states
    else:
        after = facts["path_left_out"]["after"]
        head = sum(counts[:after])
        assert expanded[:head] == states[:head]
        assert expanded[head:] == states[len(states) - (len(expanded) - head) :]


OUTPUT = st.sampled_from(["a", "stdout", "stderr"])


@given(
    st.one_of(
        st.lists(OUTPUT, min_size=1, max_size=60), st.lists(OUTPUT, min_size=150, max_size=400)
    )
)
def test_a_folded_path_still_names_every_state_and_repeats_none_twice(states: list[str]) -> None:
    """Withheld, nothing is made up or lost: every state that came is in the path or among
    those left out, no two neighbours in the path are the same state (but across what was
    left out), and every repeat and
    every count of what was left out is null."""
    facts = _path(states)
    kept = without_received_counts(facts, ["stdout"])
    path, left = kept["path"], kept["path_left_out"]
    assert left is None or left["states"] == facts["path_left_out"]["states"]  # kept: as it was
    assert set(states) == set(path) | set(left["states"] if left else ())
    cut = left["after"] if left else -1  # what was left out sits between path[cut - 1] and it
    assert all(x != y for i, (x, y) in enumerate(itertools.pairwise(path)) if i + 1 != cut)
    assert all(n is None for _, n in kept["path_repeats"])
    assert left is None or (left["runs"], left["steps"]) == (None, None)


def test_what_was_left_out_without_its_states_named_is_never_folded() -> None:
    """Facts whose ``path_left_out`` names no states (made before it did): what was left out
    may have held any state, so it stays where it was, its states unknown (null)."""
    facts = _path(["exec_accepted", *["stdout", "stderr"] * 100, "closed"])
    del facts["path_left_out"]["states"]
    kept = without_received_counts(facts, ["stdout"])
    assert kept["path_left_out"] == {"after": 3, "runs": None, "steps": None, "states": None}
    assert kept["path"] == ["exec_accepted", "stdout", "stderr", "stderr", "stdout", "closed"]
