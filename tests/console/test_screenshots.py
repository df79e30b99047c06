"""The screenshots in docs/console/ come from ``tests/console/screenshots.py``: it runs, and
what it writes is what the README links."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.console.screenshots import DOCS, PAGES, capture
from tests.external import CHROMEDRIVER, CHROMIUM

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def chromium() -> None:
    CHROMIUM.require()
    CHROMEDRIVER.require()


async def test_the_screenshot_script_captures_both_pages(tmp_path: Path, chromium: None) -> None:
    shots = await capture(tmp_path)
    assert [p.name for p in shots] == list(PAGES)
    for shot in shots:
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
        assert width == 1200 and height > 600, (shot.name, width, height)


def test_the_readme_links_the_committed_screenshots() -> None:
    text = README.read_text(encoding="utf-8")
    for name in PAGES:
        assert (DOCS / name).is_file(), name
        assert f"docs/console/{name}" in text
