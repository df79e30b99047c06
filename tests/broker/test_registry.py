"""The protocol registry: built-in protocols are found like any plugin (entry points in the
``affidavit.protocols`` group), only what is needed is imported, and a broken installation is a
clear configuration error rather than a traceback."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import affidavit.protocols.http
import affidavit.protocols.ssh
from affidavit.protocols import GROUP, get, kinds, register, registered

PROTOCOL_MODULES = ("affidavit.protocols.http", "affidavit.protocols.ssh")
ADAPTER_MODULES = ("affidavit.adapters.http", "affidavit.adapters.ssh", "ssh")


def _python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_builtin_protocols_are_found_through_their_entry_points() -> None:
    declared = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=GROUP)}
    assert declared["http"] == "affidavit.protocols.http:PROTOCOL"
    assert declared["ssh"] == "affidavit.protocols.ssh:PROTOCOL"
    assert {"http", "ssh"} <= set(kinds())
    assert get("http") is affidavit.protocols.http.PROTOCOL
    assert registered()["ssh"] is affidavit.protocols.ssh.PROTOCOL
    assert get("gopher") is None


def test_another_spec_cannot_take_a_registered_kind() -> None:
    http = get("http")
    assert http is not None
    assert register(http) is http  # the same spec again is a no-op
    with pytest.raises(ValueError, match="already registered as 'http'"):
        register(dataclasses.replace(http, binding=affidavit.protocols.http.HttpBinding))
    assert get("http") is http


def test_help_imports_no_protocol_and_scans_no_metadata() -> None:
    """``affidavit --help`` stays fast: protocols are imported when a config names them."""
    p = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "affidavit", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0 and "diagrams" in p.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in p.stderr.splitlines()}
    assert "affidavit.cli" in imported  # the command line is imported, and nothing heavy
    for name in (*PROTOCOL_MODULES, *ADAPTER_MODULES, "importlib.metadata", "affidavit.config"):
        assert name not in imported, name


def test_a_config_imports_only_the_protocols_it_names(tmp_path: Path) -> None:
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text(
        f'[journal]\npath = "{tmp_path / "j.db"}"\n[targets.api]\nkind = "http"\n'
        'url = "https://api.example"\nmethods = ["GET"]\ncredential = "env:T"\n'
    )
    code = (
        "import sys, json, trio\n"
        "from affidavit.api.broker import Broker\n"
        "async def main():\n"
        f"    async with Broker.open({str(cfg)!r}):\n"
        "        pass\n"
        "trio.run(main)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    p = _python(code)
    assert p.returncode == 0, p.stderr
    imported = set(json.loads(p.stdout))
    assert {"affidavit.protocols.http", "affidavit.adapters.http"} <= imported
    assert not {"affidavit.protocols.ssh", "affidavit.adapters.ssh", "ssh"} & imported


def test_a_broken_installed_protocol_is_a_config_error_naming_it(tmp_path: Path) -> None:
    info = tmp_path / "site" / "broken_protocol-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-protocol\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[affidavit.protocols]\nbroken = no_such_module_anywhere:PROTOCOL\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text('[targets.x]\nkind = "broken"\ncredential = "env:T"\n')
    p = subprocess.run(
        [sys.executable, "-m", "affidavit", "call", "--config", str(cfg)],
        input="{}",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2
    assert "Traceback" not in p.stderr
    assert p.stderr.startswith(
        f"affidavit: CONFIG_INVALID: {cfg}: targets.x.kind: cannot load "
        "no_such_module_anywhere:PROTOCOL (ModuleNotFoundError("
    ), p.stderr
    # A config that does not name it is unaffected (nothing imports it).
    code = (
        "from affidavit.config import config_from_dict\n"
        "from affidavit.protocols import kinds\n"
        "from pathlib import Path\n"
        "t = {'kind': 'http', 'url': 'https://a.example', 'methods': ['GET'], "
        "'credential': 'env:T'}\n"
        "config_from_dict({'targets': {'a': t}}, base_dir=Path('/'))\n"
        "print(kinds())\n"
    )
    ok = _python(code, env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == "['broken', 'http', 'ssh']"


_OLD_PROTOCOL = """
import dataclasses
from tests.toy_protocol.protocol import PROTOCOL as TOY, ToyBinding

class OldBinding(ToyBinding):
    def prepare(self, action, target, credential, key):
        raise AssertionError("never called: refused when loaded")

PROTOCOL = dataclasses.replace(TOY, binding=OldBinding)
"""


def test_an_installed_protocol_whose_prepare_takes_no_trusted_is_refused_at_load(
    tmp_path: Path,
) -> None:
    """A protocol written before ``Binding.prepare`` took ``trusted`` (four arguments) is a
    configuration error naming its kind and the fix when a config names it -- never a
    TypeError at its first call."""
    from affidavit.protocols.registry import OLD_PREPARE

    site = tmp_path / "site"
    info = site / "old_protocol-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: old-protocol\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[affidavit.protocols]\ntoy = old_protocol:PROTOCOL\n")
    (site / "old_protocol.py").write_text(_OLD_PROTOCOL)
    here = str(Path(__file__).resolve().parents[2])  # (``tests`` importable: the toy)
    path = os.pathsep.join(p for p in (str(site), here, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    cfg = tmp_path / "affidavit.toml"
    cfg.write_text('[targets.x]\nkind = "toy"\nport = 7000\ncredential = "env:T"\n')
    p = subprocess.run(
        [sys.executable, "-m", "affidavit", "call", "--config", str(cfg)],
        input="{}",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr
    assert p.stderr.strip() == (
        f"affidavit: CONFIG_INVALID: {cfg}: targets.x.kind: {OLD_PREPARE}"
    ), p.stderr


async def test_a_binding_without_start_warnings_says_nothing_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Binding.start_warnings`` is optional: an out-of-tree binding written before it existed
    opens a broker (no words), never an AttributeError."""
    import affidavit.api.broker as broker_module
    from affidavit.api import Broker
    from affidavit.config import load_config

    from .helpers import http_target, write_config

    real = broker_module.load_bindings

    class Older:
        """The HTTP binding as a protocol written before ``start_warnings`` would be."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name == "start_warnings":
                raise AttributeError(name)
            return getattr(self._inner, name)

    monkeypatch.setattr(
        broker_module,
        "load_bindings",
        lambda kinds: {k: Older(b) for k, b in real(kinds).items()},
    )
    cfg = write_config(tmp_path, {"api": http_target("https://127.0.0.1:9")})
    async with Broker.open(config=load_config(cfg)) as broker:
        assert broker is not None


def _static_prepare(action: Any, target: Any, credential: Any, key: Any, trusted: Any) -> Any:
    raise AssertionError("never called")


def _old_static_prepare(action: Any, target: Any, credential: Any, key: Any) -> Any:
    raise AssertionError("never called")


def _class_prepare(
    cls: Any, action: Any, target: Any, credential: Any, key: Any, trusted: Any
) -> Any:
    raise AssertionError("never called")


def _old_class_prepare(cls: Any, action: Any, target: Any, credential: Any, key: Any) -> Any:
    raise AssertionError("never called")


@pytest.mark.parametrize(
    ("prepare", "accepted"),
    [
        (staticmethod(_static_prepare), True),
        (classmethod(_class_prepare), True),
        (staticmethod(_old_static_prepare), False),
        (classmethod(_old_class_prepare), False),
    ],
    ids=["static", "class", "static-four", "class-four"],
)
def test_an_installed_binding_whose_prepare_is_a_static_or_class_method_is_judged_by_its_arguments(
    monkeypatch: pytest.MonkeyPatch, prepare: Any, accepted: bool
) -> None:
    """``Binding.prepare`` as a ``staticmethod`` or ``classmethod`` takes no ``self``: with the
    five arguments it loads, with four it is refused ``OLD_PREPARE`` (a configuration error
    naming the kind) as a plain method with four is."""
    from affidavit.protocols import registry
    from tests.toy_protocol.protocol import PROTOCOL as TOY
    from tests.toy_protocol.protocol import ToyBinding

    binding = type("InstalledBinding", (ToyBinding,), {"prepare": prepare})
    spec = dataclasses.replace(TOY, binding=binding)

    class EntryPoint:
        value = "installed_protocol:PROTOCOL"

        def load(self) -> Any:
            return spec

    monkeypatch.setattr(registry, "_specs", {})
    monkeypatch.setattr(registry, "_entry_points", {"toy": [EntryPoint()]})
    monkeypatch.setattr(registry, "register_table", lambda table: table)  # (no table left behind)
    if accepted:
        assert registry.get("toy") is spec
        return
    with pytest.raises(registry.ProtocolLoadError) as info:
        registry.get("toy")
    assert (info.value.kind, info.value.message) == ("toy", registry.OLD_PREPARE)
