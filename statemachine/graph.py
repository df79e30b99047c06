"""Graph checks over declared tables — shared by the lifecycle table, every protocol table and
the model-checking tests.  Pure functions over ``(source, event, dest)`` edges."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

__all__ = ["can_reach", "lifecycle_problems", "post_boundary_states", "reachable"]

Edge = tuple[str, str, str]


def _adjacency(edges: Iterable[Edge]) -> dict[str, set[str]]:
    adj: dict[str, set[str]] = {}
    for src, _ev, dst in edges:
        adj.setdefault(src, set()).add(dst)
    return adj


def reachable(
    initial: str, edges: Iterable[Edge], *, skip: Collection[tuple[str, str]] = ()
) -> set[str]:
    """States reachable from ``initial``, not following the (source, event) pairs in ``skip``."""
    by_src: dict[str, list[tuple[str, str]]] = {}
    for src, ev, dst in edges:
        by_src.setdefault(src, []).append((ev, dst))
    seen = {initial}
    todo = [initial]
    while todo:
        s = todo.pop()
        for ev, dst in by_src.get(s, ()):
            if (s, ev) in skip or dst in seen:
                continue
            seen.add(dst)
            todo.append(dst)
    return seen


def can_reach(targets: Collection[str], edges: Iterable[Edge]) -> set[str]:
    """States from which some state in ``targets`` is reachable (targets included)."""
    rev: dict[str, set[str]] = {}
    for src, _ev, dst in edges:
        rev.setdefault(dst, set()).add(src)
    seen = set(targets)
    todo = list(targets)
    while todo:
        s = todo.pop()
        for src in rev.get(s, ()):
            if src not in seen:
                seen.add(src)
                todo.append(src)
    return seen


def post_boundary_states(
    initial: str, edges: Iterable[Edge], boundary: Collection[tuple[str, str]]
) -> frozenset[str]:
    """States reachable only by crossing one of the ``boundary`` transitions."""
    edges = list(edges)
    everything = reachable(initial, edges)
    before = reachable(initial, edges, skip=boundary)
    return frozenset(everything - before)


def lifecycle_problems(
    initial: str,
    outcomes: Mapping[str, str],
    final: Collection[str],
    edges: Iterable[Edge],
) -> list[str]:
    """The seed's structural invariants over a lifecycle-shaped table.

    * every state is reachable from ``initial``;
    * every state can reach a final state;
    * no path leads from a state whose outcome is not ``not_attempted`` to one whose outcome is
      (seed: "The broker never moves it back to not_attempted");
    * no path leads from ``committed`` or ``rejected`` to ``unknown`` or ``not_attempted``.
    """
    edges = list(edges)
    out: list[str] = []
    seen = reachable(initial, edges)
    for s in sorted(set(outcomes) - seen):
        out.append(f"state {s!r} is unreachable")
    stuck = set(outcomes) - can_reach(final, edges)
    for s in sorted(stuck):
        out.append(f"state {s!r} cannot reach a final state")
    rank = {"not_attempted": 0, "unknown": 1, "rejected": 2, "committed": 2}
    for src, ev, dst in edges:
        a, b = outcomes[src], outcomes[dst]
        if rank[b] < rank[a]:
            out.append(f"{src} --{ev}--> {dst} moves outcome back from {a} to {b}")
        elif rank[a] == 2 and a != b:
            out.append(f"{src} --{ev}--> {dst} changes a resolved outcome from {a} to {b}")
    # Paths, not just edges: a chain through intermediate states must not regress either.
    for s in sorted(outcomes):
        if outcomes[s] == "not_attempted":
            continue
        for t in sorted(reachable(s, edges)):
            if rank[outcomes[t]] < rank[outcomes[s]]:
                out.append(f"a path leads from {s} ({outcomes[s]}) to {t} ({outcomes[t]})")
    return out
