"""``affidavit console-url`` says how long its link lasts as docs/console.md shows it:
``(one use, within 300 s)`` -- the link expires ``TOKEN_TTL`` after it was minted, and the
seconds left are rounded up to the moment it expires by.  An integer floor of the time left,
taken a moment after the mint, printed 299; one past its time says it has expired, not "0 s"."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

import affidavit.cli.console as console_cli
from affidavit.cli import main
from affidavit.console import TOKEN_TTL

MINTED = 1_800_000_000.0


@pytest.mark.parametrize(
    ("printed_after", "said"),
    [
        (0.0, "within 300 s"),
        (0.004, "within 300 s"),
        (0.75, "within 300 s"),
        (1.25, "within 299 s"),
        (TOKEN_TTL - 0.5, "within 1 s"),
        (TOKEN_TTL, "already expired: ask for another"),
        (TOKEN_TTL + 5, "already expired: ask for another"),
    ],
)
def test_the_link_is_said_to_last_what_it_was_minted_for(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    printed_after: float,
    said: str,
) -> None:
    assert TOKEN_TTL == 300  # the lifetime docs/console.md shows
    answer = {"url": "http://127.0.0.1:8470/login?token=t", "expires_at": MINTED + TOKEN_TTL}

    def embedded(args: Any) -> dict[str, Any]:
        return answer

    monkeypatch.delenv("AFFIDAVIT_SOCKET", raising=False)
    monkeypatch.setattr(console_cli, "_embedded", embedded)
    monkeypatch.setattr(
        console_cli, "time", types.SimpleNamespace(time=lambda: MINTED + printed_after)
    )
    assert main(["console-url", "--config", str(tmp_path / "affidavit.toml")]) == 0
    out, err = capsys.readouterr()
    assert out == f"{answer['url']}\n"
    assert err == f"(one use, {said})\n"
