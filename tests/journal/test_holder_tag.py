"""The lease holder's tag a caller is shown (``JournalReader.holder_tag``; docs/contract.md, "The
lease holder"): derived as documented, from the record and the journal's broker key alone."""

from __future__ import annotations

from pathlib import Path

from affidavit.journal import Journal, JournalReader
from affidavit.journal.sealing import BrokerKey

HOLDER = "broker-host:4242:1f2e3d4c"


async def test_the_tag_is_the_documented_keyed_digest_the_same_for_every_reader(
    tmp_path: Path,
) -> None:
    async with Journal.open(tmp_path / "j.db") as j:
        tag = j.holder_tag("act_1", HOLDER)
        assert tag == j.holder_tag("act_1", HOLDER)  # stable
        key = BrokerKey.load(tmp_path / "j.db.key")
        data = b"act_1\0" + HOLDER.encode()
        assert tag == "hmac-sha256:" + key.digest("lease holder", data)
        # Another holder, or the same holder of another invocation: another tag (no two
        # invocations are linked by their holder).
        assert j.holder_tag("act_1", "broker-host:4242:00000000") != tag
        assert j.holder_tag("act_2", HOLDER) != tag
        # A holder a row altered into a lone surrogate is tagged, never a traceback.
        assert j.holder_tag("act_1", "\ud800").startswith("hmac-sha256:")
    # A read-only reader with the key file (the operator's `journal holder`) agrees.
    with JournalReader.open(tmp_path / "j.db", key_file=tmp_path / "j.db.key") as r:
        assert r.holder_tag("act_1", HOLDER) == tag
    # Another journal's key: another tag -- the value is per journal, unguessable without it.
    async with Journal.open(tmp_path / "other.db") as other:
        assert other.holder_tag("act_1", HOLDER) != tag
