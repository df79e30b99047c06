"""A checkpoint's signed bytes are written directly, not through a sorted-keys encoder, and the
signature comes straight from libsodium's binding (issue 15: once per transaction in the single
writer, once per checkpoint in ``verify``).  The bytes must be ``canonical_json``'s of the
fields, as every checkpoint already recorded was signed over: fuzzed here against the encoder
itself, and a whole journal's checkpoints checked against messages built the old way."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.journal import Journal, JournalReader, SigningKey, signing
from affidavit.journal.chain import canonical_json
from affidavit.journal.signing import Checkpoint, checkpoint_message, verify_signature

from .helpers import Ticking, happy


def encoded(seq: Any, hash_: Any, prev: Any, at: Any, adopted: Any) -> bytes:
    """The message as it was built before (and still is for other types): the encoder's."""
    body = {"adopted": adopted, "at": at, "hash": hash_, "prev": prev, "seq": seq}
    return b"affidavit-checkpoint-v1\n" + canonical_json(body).encode("utf-8")


FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e-07, 1e16, 1e22, 5e-324, 1.7976931348623157e308]),
    st.sampled_from([1733372800.0000002, 1796445319.748941, 0.1]),
)
INTS = st.integers(min_value=-(2**70), max_value=2**70)
TEXT = st.text(st.characters(codec="utf-8"), max_size=70)


@settings(max_examples=400, deadline=None)
@given(seq=INTS, hash_=st.one_of(TEXT, st.just("ab" * 32)), prev=INTS, at=FLOATS,
       adopted=st.booleans())  # fmt: skip
def test_the_message_is_the_encoders_bytes(
    seq: int, hash_: str, prev: int, at: float, adopted: bool
) -> None:
    fields = (seq, hash_, prev, at, adopted)
    assert checkpoint_message(*fields) == encoded(*fields)


@pytest.mark.parametrize(
    "fields",
    [
        (True, "ab", 0, 1.5, False),  # a bool seq: the encoder writes true
        (1, "ab", 0, 2, False),  # an int time (an anchor's, before float())
        (1, "ab", 0, 1.5, 1),  # an int for adopted
    ],
)
def test_other_types_are_encoded_by_the_encoder(fields: tuple[Any, ...]) -> None:
    assert checkpoint_message(*fields) == encoded(*fields)


@pytest.mark.parametrize("at", [float("nan"), float("inf"), -float("inf")])
def test_a_time_that_is_not_finite_is_refused_as_before(at: float) -> None:
    with pytest.raises(ValueError):
        checkpoint_message(1, "ab", 0, at, False)


def test_the_writers_types_skip_the_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct path is the one taken for what the writer signs (else this change is gone)."""

    def refuse(_: Any) -> str:
        raise AssertionError("canonical_json called for a checkpoint of exact types")

    monkeypatch.setattr(signing, "canonical_json", refuse)
    assert checkpoint_message(7, "ab" * 32, 1, 1796445319.748941, False) == encoded(
        7, "ab" * 32, 1, 1796445319.748941, False
    )


def test_sign_makes_the_checkpoint_the_constructor_makes(tmp_path: Path) -> None:
    key = SigningKey.create(tmp_path / "k.pem")
    cp = key.sign(7, "ab" * 32, 1, 1796445319.748941)
    message = encoded(7, "ab" * 32, 1, 1796445319.748941, False)
    assert type(cp) is Checkpoint
    assert cp == Checkpoint(7, "ab" * 32, 1, 1796445319.748941, False, key.key_id,
                            key._priv.sign(message))  # fmt: skip
    assert verify_signature(cp, key.public_raw)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cp.seq = 8  # type: ignore[misc]
    adopted = SigningKey.load(tmp_path / "k.pem").sign(3, "cd" * 32, 0, 1.5, adopted=True)
    assert adopted.adopted is True
    assert adopted.signature == key._priv.sign(encoded(3, "cd" * 32, 0, 1.5, True))


async def test_a_journals_checkpoints_are_signed_over_the_old_bytes(tmp_path: Path) -> None:
    """Every checkpoint a writer records (a fixed clock: deterministic times) is the signature,
    by the journal's key, of the message built the old way -- Ed25519 is deterministic, so the
    rows are byte for byte what the writer wrote before -- and the journal verifies."""
    db = tmp_path / "j.db"
    async with Journal.open(db, clock=Ticking()) as j:
        for ev in happy("inv-1") + happy("inv-2"):
            await j.append(ev, barrier=True)
    key = SigningKey.load(f"{db}.signing.key")
    conn = sqlite3.connect(db)
    sql = "SELECT seq, hash, prev, at, adopted, key_id, signature FROM checkpoints"
    rows = conn.execute(sql).fetchall()
    conn.close()
    assert len(rows) > 1
    for seq, h, prev, at, adopted, key_id, sig in rows:
        assert key_id == key.key_id
        assert sig == key._priv.sign(encoded(seq, h, prev, at, bool(adopted)))
    with JournalReader.open(db) as r:
        report = r.verify()
    assert report.ok, report
