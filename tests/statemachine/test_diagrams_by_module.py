"""The committed diagram set is every table an ``adapters/<proto>/`` package's modules register,
matched by module rather than by name: a table named otherwise than its folder, and a package's
second table, are drawn; a folder that registers none is refused naming the folder and what is
registered, never a bare DIAGRAM_FAILED (review 51 round 2, item 1)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from affidavit import adapters
from affidavit.docgen import generate as dg
from affidavit.docgen.common import DiagramError
from affidavit.statemachine import unregister

MAIN = """import dataclasses
from affidavit.statemachine import register
from affidavit.adapters.http import machine
ZED_TABLE = register(dataclasses.replace(machine.HTTP_TABLE, name="zed_main"))
from . import extra
"""
EXTRA = """import dataclasses
from affidavit.statemachine import register
from affidavit.adapters.http import machine
SECOND = register(dataclasses.replace(machine.HTTP_TABLE, name="zed_second"))
"""


@pytest.fixture
def extra_adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A second folder on ``adapters``' path, its packages forgotten after the test."""
    monkeypatch.setattr(adapters, "__path__", [*adapters.__path__, str(tmp_path)])
    try:
        yield tmp_path
    finally:
        for name in [
            n
            for n in sys.modules
            if n.startswith(("affidavit.adapters.zed", "affidavit.adapters.wip"))
        ]:
            del sys.modules[name]
        unregister("zed_main")
        unregister("zed_second")


def test_tables_named_otherwise_and_a_second_table_are_drawn(extra_adapters: Path) -> None:
    (extra_adapters / "zed").mkdir()
    (extra_adapters / "zed" / "__init__.py").write_text(MAIN)
    (extra_adapters / "zed" / "extra.py").write_text(EXTRA)
    tables = dg.builtin_tables()
    assert sorted(tables) == ["http", "ssh", "zed_main", "zed_second"]
    assert "diagrams/protocol-zed_second.mmd" in dg.generated_files(tables)


def test_a_folder_registering_no_table_is_named(extra_adapters: Path) -> None:
    (extra_adapters / "wip").mkdir()
    (extra_adapters / "wip" / "__init__.py").write_text('"""Not done yet."""\n')
    with pytest.raises(DiagramError) as info:
        dg.builtin_tables()
    message = str(info.value)
    assert message.startswith("adapters/wip/ registers no protocol table: ")
    assert "expected e.g. WIP_TABLE = register(...)" in message
    assert "registered: http, ssh" in message
