"""``approvals``' own options (``--config``, ``--socket``, ``--daemon-uid``) given before a
sub-command's name are kept: each sub-command declares them again (so they may also follow its
name), and argparse lets a sub-parser's default overwrite what was given before it -- so
``affidavit approvals --config X approve ID`` acted on ``$AFFIDAVIT_CONFIG`` or
``./affidavit.toml``, another journal than the one named."""

from __future__ import annotations

import pytest

from affidavit.cli import build_parser

OPTIONS = (("--config", "config", "/etc/affidavit/a.toml"), ("--socket", "socket", "/run/a.sock"))


@pytest.mark.parametrize("verb", ["show", "approve", "deny", "revoke"])
@pytest.mark.parametrize(("flag", "dest", "value"), OPTIONS)
def test_an_option_before_the_sub_command_is_kept(verb: str, flag: str, dest: str, value: str):
    parser = build_parser("approvals")
    before = parser.parse_args(["approvals", flag, value, verb, "inv-1"])
    after = parser.parse_args(["approvals", verb, "inv-1", flag, value])
    neither = parser.parse_args(["approvals", verb, "inv-1"])
    assert (getattr(before, dest), getattr(after, dest)) == (value, value)
    assert getattr(neither, dest) is None
    assert parser.parse_args(["approvals", "--daemon-uid", "7", verb, "inv-1"]).daemon_uid == "7"
