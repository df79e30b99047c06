from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from affidavit.adapters.http import HttpClient

from .hostile import TlsFixture, make_tls


@pytest.fixture
async def client() -> AsyncIterator[HttpClient]:
    async with HttpClient() as c:
        yield c


@pytest.fixture
def tls(tmp_path: Path) -> TlsFixture:
    return make_tls(tmp_path)
