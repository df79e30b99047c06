"""A path setting starting with ``~`` is refused at its field (CONFIG_INVALID), never expanded
(audit 50b, ``tilde.sh``): expanded against the ``$HOME`` of whichever process loads the config,
one file named the operator's vault to the CLI and the daemon's to the daemon."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from affidavit.config import ConfigError, config_from_dict

TARGET = {
    "kind": "http",
    "url": "https://x.example",
    "methods": ["GET"],
    "idempotent": [],
    "credential": "env:TOKEN",
    "inject": "bearer",
}


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"vault": {"path": "~/affidavit.vault"}}, "vault.path"),
        ({"journal": {"path": "~op/affidavit.db"}}, "journal.path"),
        ({"targets": {"t": {**TARGET, "credential": "file:~/tok"}}}, "targets.t.credential"),
        ({"targets": {"t": {**TARGET, "ca_file": "~/ca.pem"}}}, "targets.t.ca_file"),
    ],
)
def test_a_path_starting_with_a_tilde_is_refused_at_its_field(
    tmp_path: Path, data: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_from_dict(data, base_dir=tmp_path)
    assert caught.value.code == "CONFIG_INVALID" and caught.value.field == field
    assert 'starts with "~", which is not expanded' in caught.value.message


def test_a_tilde_inside_a_path_is_a_name_like_any_other(tmp_path: Path) -> None:
    config = config_from_dict({"vault": {"path": "a~/v"}}, base_dir=tmp_path)
    assert config.vault_path == tmp_path / "a~" / "v"
