"""``Observation.__init__`` is written by hand (slot setters, issue 15): it must build exactly
what the frozen dataclass's generated constructor built -- every field from the same
arguments, positional or by name, with the same defaults -- and stay frozen and comparable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from affidavit.adapters.http.machine import Observation

FIELDS = [f.name for f in dataclasses.fields(Observation)]


def generated(*args: Any, **kwargs: Any) -> Observation:
    """What the dataclass's own constructor does: bind to the declared fields and their
    defaults, store each through ``object.__setattr__``."""
    defaults = {
        f.name: f.default
        for f in dataclasses.fields(Observation)
        if f.default is not dataclasses.MISSING
    }
    values = {**defaults, **dict(zip(FIELDS, args, strict=False)), **kwargs}
    o = object.__new__(Observation)
    for name in FIELDS:
        object.__setattr__(o, name, values[name])
    return o


CASES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("headers_sent", {"hop": 1}), {}),
    (("body", {"hop": 1, "bytes": 3}), {"data": b"abc"}),
    (("response_headers", {"hop": 2}, b"", 200, "OK", (("a", "b"),)), {}),
    (("end",), {"facts": {}, "status": 204, "reason": "No Content"}),
    ((), {"step": "x", "facts": {"k": [1]}, "headers": (("n", "v"),), "data": b"\0"}),
]


@pytest.mark.parametrize(("args", "kwargs"), CASES)
def test_same_as_generated_constructor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    ours = Observation(*args, **kwargs)
    theirs = generated(*args, **kwargs)
    assert type(ours) is Observation
    assert ours == theirs
    assert [getattr(ours, n) for n in FIELDS] == [getattr(theirs, n) for n in FIELDS]
    assert repr(ours) == repr(theirs)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ours.step = "other"  # type: ignore[misc]


def test_refuses_what_the_generated_constructor_refuses() -> None:
    with pytest.raises(TypeError):
        Observation("x")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Observation("x", {}, nope=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Observation("x", {}, b"", None, "", (), "extra")  # type: ignore[call-arg]
