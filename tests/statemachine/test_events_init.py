"""``Event.__init__`` is written by hand (slot setters, issue 15): it must build exactly what
the frozen dataclass's generated constructor built -- every field from the same arguments,
positional or by name, with the same defaults, a fresh ``attrs`` dict when none is given --
and the instance must stay frozen, equal, hashable by value and picklable."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from affidavit.statemachine import Event, EventKind, EvidenceSource

FIELDS = [f.name for f in dataclasses.fields(Event)]


def generated(*args: Any, **kwargs: Any) -> Event:
    """What the dataclass's own constructor does: bind to the declared fields and their
    defaults, store each through ``object.__setattr__``."""
    defaults = {
        f.name: (f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default)
        for f in dataclasses.fields(Event)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    values = {**defaults, **dict(zip(FIELDS, args, strict=False)), **kwargs}
    e = object.__new__(Event)
    for name in FIELDS:
        object.__setattr__(e, name, values[name])
    return e


_values = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(list(EventKind)),
        "invocation_id": st.text(max_size=8),
        "attrs": st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
        "source": st.sampled_from(list(EvidenceSource)),
        "seq": st.none() | st.integers(),
        "at": st.none() | st.floats(allow_nan=False),
        "observer": st.none() | st.text(max_size=4),
        "observer_seq": st.none() | st.integers(),
    }
)


@given(_values, st.integers(min_value=2, max_value=len(FIELDS)), st.booleans())
def test_the_constructor_stores_every_field_as_the_generated_one(
    values: dict[str, Any], n_positional: int, by_name: bool
) -> None:
    given_fields = FIELDS[:n_positional]
    args = [values[k] for k in given_fields]
    if by_name:
        built, want = Event(**dict(zip(given_fields, args, strict=True))), generated(*args)
    else:
        built, want = Event(*args), generated(*args)
    assert [getattr(built, f) for f in FIELDS] == [getattr(want, f) for f in FIELDS]
    assert built == want and hash(built.kind) == hash(want.kind)
    assert pickle.loads(pickle.dumps(built)) == built
    assert dataclasses.replace(built, seq=7) == generated(
        *[7 if f == "seq" else getattr(built, f) for f in FIELDS]
    )


def test_left_out_attrs_are_a_fresh_empty_dict_each_time() -> None:
    a, b = Event(EventKind.REQUEST_SENT, "i"), Event(EventKind.REQUEST_SENT, "i")
    assert a.attrs == {} and a.attrs is not b.attrs
    assert a.source is EvidenceSource.TRANSPORT_OBSERVED
    assert (a.seq, a.at, a.observer, a.observer_seq) == (None, None, None, None)


def test_an_event_stays_frozen_and_refuses_unknown_arguments() -> None:
    e = Event(EventKind.REQUEST_SENT, "i")
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.seq = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        Event(EventKind.REQUEST_SENT)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Event(EventKind.REQUEST_SENT, "i", bogus=1)  # type: ignore[call-arg]
