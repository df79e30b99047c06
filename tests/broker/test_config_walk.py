"""The config a process acts on is opened once, through the directories judged, and judged by
``fstat`` of that descriptor (``api.trusted.open_trusted_config``, ``journal.exposure.walk``):
every directory a name is looked up in is held to the directory rule -- inside each link's
target too, where a link in the middle of the path leads -- and the bytes parsed are those of
the file judged.  The review's layout (cfgfix50b): ``a/x -> ../b/y``, ``b`` 0777 and not
sticky, ``b/y -> ../c``; the check walked the path as written, the final name's links and the
resolved path's parents, never ``b``, and a swap of ``b/y`` planted a config in 4 runs of 20."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from affidavit.api.broker import Broker
from affidavit.api.trusted import load_trusted_config
from affidavit.config import ConfigError, load_config
from affidavit.journal.exposure import directory_exposures
from tests.daemon.kit import NOBODY
from tests.external import require_root

RUNS = 20
SWAPS = 20_000
"""The swapper's bound: this many re-pointings, or ``SWAP_SECONDS``, whichever comes first."""
SWAP_SECONDS = 5.0


def _write(config: Path, port: int) -> None:
    config.write_text(
        f'[journal]\npath = "{config.parent / "j.db"}"\n'
        f'[targets.t]\nkind = "http"\nurl = "http://127.0.0.1:{port}"\nmethods = ["GET"]\n'
        'idempotent = []\ncredential = "env:TOKEN"\ninject = "bearer"\n',
        encoding="utf-8",
    )


def _layout(tmp: Path) -> tuple[Path, Path]:
    """The review's: the config named through ``a/x`` (-> ``../b/y`` -> ``../c``), ``c`` holding
    the operator's (port 9), ``evil`` a planter's (port 7); ``b`` writable by all."""
    for name in ("a", "b", "c", "evil"):
        (tmp / name).mkdir(mode=0o755)
    _write(tmp / "c" / "affidavit.toml", 9)
    _write(tmp / "evil" / "affidavit.toml", 7)
    (tmp / "b" / "y").symlink_to("../c")
    (tmp / "a" / "x").symlink_to("../b/y")
    (tmp / "b").chmod(0o777)
    return tmp / "a" / "x" / "affidavit.toml", tmp / "b"


def test_a_directory_holding_a_link_in_the_middle_of_the_path_is_judged(tmp_path: Path) -> None:
    path, b = _layout(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_trusted_config(path)
    said = str(caught.value)
    assert caught.value.code == "CONFIG_EXPOSED", said
    assert (
        f"directory {b} (on the path to the config file) is writable by group or others "
        f"(mode 0777): chmod 755 {b}"
    ) in said
    b.chmod(0o755)
    assert str(load_trusted_config(path).targets["t"].url).endswith(":9")


def test_a_link_swapped_in_the_middle_of_the_path_never_plants_a_config(tmp_path: Path) -> None:
    """Another user re-points ``b/y`` at their own directory as fast as it can (a bounded
    loop, here one thread renaming a new link over it) while the config is loaded ``RUNS``
    times: every load is refused, none returns the planter's config (nor the operator's: the
    directory is theirs to swap)."""
    path, b = _layout(tmp_path)
    done = threading.Event()

    def swap() -> None:
        deadline = time.monotonic() + SWAP_SECONDS
        for i in range(SWAPS):
            if done.is_set() or time.monotonic() > deadline:
                return
            os.symlink("../evil" if i % 2 == 0 else "../c", b / "y.new")
            os.replace(b / "y.new", b / "y")

    swapper = threading.Thread(target=swap)
    swapper.start()
    loaded: list[str] = []
    codes: list[str] = []
    try:
        for _ in range(RUNS):
            try:
                loaded.append(str(load_trusted_config(path).targets["t"].url))
            except ConfigError as exc:
                codes.append(exc.code)
    finally:
        done.set()
        swapper.join()
    assert loaded == [] and codes == ["CONFIG_EXPOSED"] * RUNS, (loaded, codes)


async def test_a_config_whose_file_changed_since_its_parse_is_refused_by_the_broker(
    tmp_path: Path,
) -> None:
    """An embedder's ``Broker.open(config=load_config(p))``: the file judged must be the file
    parsed -- bytes other than those the config came from are another config, whoever wrote
    them (the same user here: what is refused is the difference, judged or not)."""
    config_path = tmp_path / "affidavit.toml"
    _write(config_path, 9)
    config = load_config(config_path)
    async with Broker.open(config=config):
        pass
    _write(tmp_path / "new.toml", 7)
    os.replace(tmp_path / "new.toml", config_path)
    with pytest.raises(ConfigError) as caught:
        async with Broker.open(config=config):
            pass
    assert caught.value.code == "CONFIG_FILE_CHANGED", str(caught.value)  # (not "unreadable")
    assert str(caught.value) == (
        f"{config_path}: refused: the config file changed since this config was read from it "
        "(the file judged is not the one parsed): start again from the file as it is now (read "
        "it again: a new load_config, or the command run again)"
    )
    async with Broker.open(config=load_config(config_path)):  # read again: fine
        pass


@pytest.mark.parametrize(
    ("first", "second"),
    [("b", "etc/affidavit.toml"), ("./b", "etc/affidavit.toml"), ("b/x.toml", "etc")],
)
def test_a_link_reached_through_a_link_in_a_sticky_directory_is_judged(
    tmp_path: Path, first: str, second: str
) -> None:
    """The review of cfgfix50b: in a 1777 directory, root's ``a -> b`` and another user's ``b``
    -> a config root owns elsewhere.  ``b`` is that user's to re-point (the sticky bit lets
    only a link's owner replace it) whether it is named or reached through ``a``: the walk
    judged the directory's stickiness by the last step -- after ``a``, ``a``'s own lstat -- and
    accepted ``dir/a``.  The config open and ``directory_exposures`` both."""
    require_root()
    (tmp_path / "etc").mkdir(mode=0o755)
    _write(tmp_path / "etc" / "affidavit.toml", 9)
    os.link(tmp_path / "etc" / "affidavit.toml", tmp_path / "etc" / "x.toml")
    sticky = tmp_path / "shared"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "a").symlink_to(first)
    (sticky / "b").symlink_to(tmp_path / second)
    os.lchown(sticky / "b", NOBODY, NOBODY)
    for path in (sticky / "b", sticky / "a"):
        with pytest.raises(ConfigError) as caught:
            load_trusted_config(path)
        said = str(caught.value)
        assert caught.value.code == "CONFIG_EXPOSED", (path, said)
        assert f"link {sticky / 'b'} (on the path to the config file) is owned by uid {NOBODY}" in (
            said
        ), said
        found = directory_exposures([(path, "config file")])
        assert [(e.path, e.owner) for e in found] == [(sticky / "b", NOBODY)], (path, found)
    os.lchown(sticky / "b", 0, 0)
    assert str(load_trusted_config(sticky / "a").targets["t"].url).endswith(":9")


UNJUDGEABLE = "not a path this broker can judge: name the file itself"


def test_a_proc_fd_link_is_named_as_no_path_to_judge_not_as_missing(tmp_path: Path) -> None:
    """``--config /dev/stdin`` or ``<(...)`` (``/dev/fd/63``): the walk followed the
    ``/proc/<pid>/fd`` link by its text (``pipe:[...]``) and said CONFIG_NOT_FOUND, "create one
    with affidavit init" (cfgfix50b's review).  The file such a link opens is not one its text
    names: it says so, and what to do."""
    config = tmp_path / "affidavit.toml"
    _write(config, 9)
    read, write = os.pipe()
    held = os.open(config, os.O_RDONLY)
    try:
        for path in (
            f"/proc/self/fd/{read}",
            f"/dev/fd/{read}",
            f"/proc/self/fd/{held}",
            "/dev/stdin",
        ):
            with pytest.raises(ConfigError) as caught:
                load_trusted_config(path)
            assert caught.value.code == "CONFIG_UNREADABLE", (path, str(caught.value))
            assert str(caught.value) == f"{path}: cannot read config file: cannot open file " + (
                f"({UNJUDGEABLE})"
            )
        assert directory_exposures([(Path(f"/dev/fd/{read}"), "config file")]) == []
    finally:
        for fd in (read, write, held):
            os.close(fd)


def test_a_trailing_slash_after_a_config_file_is_not_a_directory(tmp_path: Path) -> None:
    """``a.toml/``: the kernel answers ENOTDIR; the config was read (the ``/`` dropped with the
    path made a ``Path``, and the walk opened a final name with a ``/`` after it: ``x ->
    affidavit.toml/``)."""
    config = tmp_path / "affidavit.toml"
    _write(config, 9)
    (tmp_path / "link").symlink_to("affidavit.toml")
    (tmp_path / "slashed").symlink_to("affidavit.toml/")
    slashed = (f"{config}/", f"{config}/.", f"{tmp_path / 'link'}/", tmp_path / "slashed")
    for path in slashed:
        with pytest.raises(ConfigError) as caught:
            load_trusted_config(path)
        assert caught.value.code == "CONFIG_UNREADABLE", (path, str(caught.value))
        assert str(caught.value).endswith("cannot open file (Not a directory)"), str(caught.value)
    assert str(load_trusted_config(config).targets["t"].url).endswith(":9")
