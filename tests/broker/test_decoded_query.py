"""Names a decoding hop makes: a proxy that decodes the path and forwards it unescaped
(segments.py's class, CVE-2024-38474) turns ``%3F``, ``%26``, ``%3B`` and ``%3D`` into ``?``,
``&``, ``;`` and ``=``, and the application behind it reads a query, or more names, where the
caller wrote one name or a value.  Such a name that servers read as a method or path override,
or as the credential's query parameter, is refused as the written one is (``FORBIDDEN_HEADER``
at ``path``); an escaped separator that forms neither is left alone.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.config import config_from_dict
from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.statemachine import Code

from .helpers import http_target


def _parse(tmp_path: Path, path: str) -> object:
    target = http_target("http://127.0.0.1:9/api", methods=["POST"], inject="query:api_key")
    config = config_from_dict({"targets": {"q": target}}, base_dir=tmp_path)
    return parse_action({"target": "q", "method": "POST", "path": path}, config)


@pytest.mark.parametrize(
    "path",
    [
        "/items/1%3F_method%3DDELETE",
        "/items/1%253F_method%253DDELETE",
        "/items/1%3Fa%3D1%26X-HTTP-Method-Override%3DDELETE",
        "/x%3Fapi_key%3Dattacker",
        "/x%3FAPI.KEY%3Dattacker",
        "/items/1?a%26_method%3DDELETE",
        "/items/1?a%3B_method%3DDELETE",
        "/x?a%26api_key%3Dattacker",
        "/x?a=1%26api_key%3Dattacker",
        "/x?a=1%26api_key%255B%255D%3Dattacker",
    ],
)
def test_a_name_a_decoding_hop_makes_is_held_to_the_query_s_rules(
    tmp_path: Path, path: str
) -> None:
    with pytest.raises(ActionInvalid) as info:
        _parse(tmp_path, path)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "path")


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
def test_an_escaped_separator_that_forms_no_refused_name_stays_allowed(
    tmp_path: Path, path: str
) -> None:
    assert _parse(tmp_path, path)
