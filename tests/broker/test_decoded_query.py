"""Names a decoding hop makes: a proxy that decodes the path and forwards it unescaped
(segments.py's class, CVE-2024-38474) turns ``%3F``, ``%26``, ``%3B`` and ``%3D`` into ``?``,
``&``, ``;`` and ``=``, and the application behind it reads a query, or more names, where the
caller wrote one name or a value.  Such a name that servers read as a method or path override,
or as the credential's query parameter, is refused as the written one is (``FORBIDDEN_HEADER``
at ``path``), worded as what a hop would read.

A path's escaped ``?`` tail is checked for every target; the query's own escaped separators
too, unless the target says its callers pass values that hold them and no hop decodes its
query (``escaped_query_values = true``): then they are values' own -- a URL-valued
parameter, a JSON value, a ``return_to`` (``params.check_query``).  The broker cannot see
such a hop, so the refusing reading is the default.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.config import config_from_dict
from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.statemachine import Code

from .helpers import http_target


def _parse(tmp_path: Path, path: str, decoding_hop: bool | None = None) -> object:
    """``decoding_hop`` False: the target sets ``escaped_query_values``; True: it says
    ``false``; None: it says nothing (the default)."""
    target = http_target(
        "http://127.0.0.1:9/api",
        methods=["POST"],
        inject="query:api_key",
        escaped_query_values=None if decoding_hop is None else not decoding_hop,
    )
    config = config_from_dict({"targets": {"q": target}}, base_dir=tmp_path)
    return parse_action({"target": "q", "method": "POST", "path": path}, config)


PATH_TAILS = [
    "/items/1%3F_method%3DDELETE",
    "/items/1%253F_method%253DDELETE",
    "/items/1%3Fa%3D1%26X-HTTP-Method-Override%3DDELETE",
    "/x%3Fapi_key%3Dattacker",
    "/x%3FAPI.KEY%3Dattacker",
]
QUERY_SPLITS = [
    "/items/1?a%26_method%3DDELETE",
    "/items/1?a%3B_method%3DDELETE",
    "/x?a%26api_key%3Dattacker",
    "/x?a=1%26api_key%3Dattacker",
    "/x?a=1%26api_key%255B%255D%3Dattacker",
    "/x?a=1%2526api_key%253Dattacker",  # a hop that decodes twice
    "/x?a=1%252526api_key%25253Dattacker",  # three times
]
LEGIT = [
    # A URL-valued parameter (a callback), a JSON filter, a return_to: escaped separators that
    # are the values' own.
    "/x?url=https%3A%2F%2Fme.example%2Fcb%3Fa%3D1%26api_key%3Dabc",
    "/x?filter=%7B%22q%22%3A%22a%26api_key%3Db%22%7D",
    "/x?return_to=%2Fitems%2F1%3Fa%3D1%26_method%3Dpatch",
]


@pytest.mark.parametrize("decoding_hop", [False, True])
@pytest.mark.parametrize("path", PATH_TAILS)
def test_a_name_a_decoding_hop_makes_in_a_path_is_refused_for_every_target(
    tmp_path: Path, path: str, decoding_hop: bool
) -> None:
    with pytest.raises(ActionInvalid) as info:
        _parse(tmp_path, path, decoding_hop)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "path")
    assert info.value.message.startswith("a decoding hop would read")
    assert "separators" not in info.value.message  # an escaped "?", not a separator
    if "api" in path.lower():
        assert 'the path\'s escaped "?" decoded' in info.value.message


@pytest.mark.parametrize("decoding_hop", [None, True], ids=["default", "said"])
@pytest.mark.parametrize("path", QUERY_SPLITS + LEGIT)
def test_a_name_a_decoding_hop_makes_in_the_query_is_refused_unless_values_hold_them(
    tmp_path: Path, path: str, decoding_hop: bool | None
) -> None:
    with pytest.raises(ActionInvalid) as info:
        _parse(tmp_path, path, decoding_hop)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "path")
    assert info.value.message.startswith("a decoding hop would read"), info.value.message
    if "api_key" in path:
        assert "its escaped separators decoded" in info.value.message


@pytest.mark.parametrize("path", QUERY_SPLITS + LEGIT)
def test_a_query_s_escaped_separators_are_values_own_for_escaped_query_values(
    tmp_path: Path, path: str
) -> None:
    assert _parse(tmp_path, path, decoding_hop=False)


@pytest.mark.parametrize(
    "path",
    [
        "/search?q=a%26b",
        "/search?q=fish%26chips%3Dgood",
        "/search?q=a%26%0A",
        "/files/a%3Fb.txt",
        "/files/report%3Fdraft%3D1",
        "/x?next=%2Fitems%3Fpage%3D2",
    ],
)
@pytest.mark.parametrize("decoding_hop", [False, True])
def test_an_escaped_separator_that_forms_no_refused_name_stays_allowed(
    tmp_path: Path, path: str, decoding_hop: bool
) -> None:
    assert _parse(tmp_path, path, decoding_hop)


@pytest.mark.parametrize("path", ["/x?_method=DELETE", "/x?api_key=a", "/x?%255Fmethod=1"])
@pytest.mark.parametrize("decoding_hop", [False, True])
def test_a_name_written_in_the_query_is_refused_for_every_target(
    tmp_path: Path, path: str, decoding_hop: bool
) -> None:
    with pytest.raises(ActionInvalid) as info:
        _parse(tmp_path, path, decoding_hop)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "path")
    assert not info.value.message.startswith("a decoding hop")
