"""Which stored result is the target's word (engine/readable.py, ``from_elsewhere``): only one
whose final hop is on the target's origin and was sent with the credential.  Records written
before hops said so (``credential_sent`` absent, not None) prove the credential went only where
the result is the caller's own request: a single hop."""

from __future__ import annotations

from typing import Any

import pytest

from affidavit.engine.readable import OTHER_ORIGIN, from_elsewhere, unreadable

TARGET = "https://api.example"
OTHER = "https://cdn.example"


def _hop(origin: str, **extra: Any) -> dict[str, Any]:
    return {"hop": 1, "method": "POST", "origin": origin, "status": 202, **extra}


ROWS = [
    ("no hops (another protocol)", {}, False),
    ("one hop, with the credential", {"hops": [_hop(TARGET, credential_sent=True)]}, False),
    ("one hop recorded before credential_sent", {"hops": [_hop(TARGET)]}, False),
    ("final hop on another origin", {"hops": [_hop(TARGET), _hop(OTHER)]}, True),
    (
        "final hop on the origin, outside the base path",
        {"hops": [_hop(TARGET, credential_sent=True), _hop(TARGET, credential_sent=False)]},
        True,
    ),
    (
        "final hop back in scope, with the credential",
        {"hops": [_hop(TARGET, credential_sent=True), _hop(TARGET, credential_sent=True)]},
        False,
    ),
    ("two hops recorded before credential_sent", {"hops": [_hop(TARGET), _hop(TARGET)]}, True),
    ("a hop that is no table", {"hops": ["?"]}, True),
]


@pytest.mark.parametrize(("summary", "elsewhere"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_only_a_final_hop_sent_with_the_credential_to_the_origin_is_the_targets_word(
    summary: dict[str, Any], elsewhere: bool
) -> None:
    assert from_elsewhere(summary, origin=TARGET) is elsewhere
    assert unreadable(summary, origin=TARGET) == (OTHER_ORIGIN if elsewhere else None)
