"""Headers a caller may not set, beyond the credential's: each is refused at parse,
``FORBIDDEN_HEADER`` at ``headers.<name>``, before anything is resolved or sent -- names
compared as servers read them (any case, ``_`` as ``-``).

* ``Expect``: the transport sends ``100-continue`` itself or not at all, and drops a caller's;
  accepted, it would be recorded (fingerprint, operator view) but never sent -- the record
  would claim more than was sent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from affidavit.config import config_from_dict
from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.statemachine import Code

from .helpers import http_target

REFUSED = ["Expect", "expect", "EXPECT"]


def _parse(tmp_path: Path, headers: dict[str, str]) -> object:
    config = config_from_dict(
        {"targets": {"t": http_target("http://127.0.0.1:9/api", methods=["POST"])}},
        base_dir=tmp_path,
    )
    action = {"target": "t", "method": "POST", "path": "/x", "headers": headers, "body": "hi"}
    return parse_action(action, config)


@pytest.mark.parametrize("name", REFUSED)
def test_a_header_the_transport_or_the_target_s_routing_owns_is_refused(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ActionInvalid) as info:
        _parse(tmp_path, {name: "100-continue", "Content-Type": "text/plain"})
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, f"headers.{name}")


def test_other_headers_stay_allowed(tmp_path: Path) -> None:
    assert _parse(tmp_path, {"Accept": "text/plain", "X-Request-Id": "r1"})
