"""Binding a journal to its keys when a writer opens it: the schema (the backend's), the broker's
sealing key and the signing keys its checkpoints are checked with.

* The sealing key (``BrokerKey``): a new journal records its id (creating the file 0600 if there
  is none); an existing one must be opened with the key it recorded.  Every broker on a shared
  journal holds the same sealing key: any of them reads back the results another stored.
* The signing key: on SQLite, one key, recorded when the journal was made; a journal with rows
  must end in a checkpoint it signed.  On PostgreSQL (``Backend.multi_signer``), each broker has
  its own key and *registers* its public half in the journal when it first opens it; a
  checkpoint names the key that signed it, and the set of registered keys is what a writer
  checks the head with and what ``verify`` trusts by default (``verify --public-key``, given
  once per broker, checks against keys kept elsewhere).
* A SQLite journal written before signing existed (rows, no recorded signing key, no
  checkpoint, no signing key file yet) is *adopted*: the new key signs its head in a checkpoint
  marked ``adopted``, which ``verify`` reports.  One that only looks so -- a schema or a row
  only a signing broker writes (``checkpoints.signing_era``) -- had its signing records
  removed, and is refused (``SigningRecordsRemoved``): adopting it would sign over whatever was
  done to it meanwhile.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from affidavit.privatefile import FileId

from . import checkpoints
from .backend import Backend
from .checkpoints import Keys
from .errors import JournalError, SigningRecordsRemoved
from .sealing import BrokerKey
from .signing import SigningKey, key_id_of
from .tables import Tables

__all__ = ["REGISTERED", "Made", "bind_keys", "recorded_keys"]

Made = list[tuple[Path, FileId]]
"""The key files a first transaction created, each with the ``FileId`` it created."""

REGISTERED = "signing_key:"
"""Meta names of registered signing keys: ``signing_key:<key id>`` -> base64 of the raw key."""


def recorded_keys(tables: Tables) -> dict[str, bytes]:
    """The signing public keys the journal records: SQLite's one key (``signing_public_key``)
    and every key a broker registered.  The journal holds them, so whoever can rewrite it can
    replace them: ``verify --public-key`` checks against keys kept elsewhere."""
    out: dict[str, bytes] = {}
    texts = list(tables.meta_prefixed(REGISTERED).values())
    single = tables.meta("signing_public_key")
    if single is not None:
        texts.append(single)
    for text in texts:
        try:
            raw = base64.b64decode(text, validate=True)
        except (ValueError, binascii.Error):
            continue
        if len(raw) == 32:
            out[key_id_of(raw)] = raw
    return out


def bind_keys(
    backend: Backend,
    tables: Tables,
    key_file: Path,
    signing_key_file: Path,
    clock: Callable[[], float],
    schema: str | None,
    made: Made,
) -> tuple[BrokerKey, SigningKey]:
    """Inside the writer's first transaction, after ``Backend.create``: the sealing key and
    this broker's signing key, each checked against (or recorded in) the journal.  ``schema``:
    the one the journal recorded before (``create``'s answer).  ``made``: each key file
    created here (exclusively: never one already there) is added to it with its ``FileId`` --
    the caller removes them if the transaction rolls back, each only while its path still
    names that file (``privatefile.unlink_if_made``: nothing recorded their ids; left, they
    would mark a journal that never was)."""
    key = _broker_key(backend, tables, key_file, made)
    if backend.multi_signer:
        signer = _register(backend, tables, signing_key_file, made)
    else:
        signer = _single_signer(backend, tables, signing_key_file, clock, schema, made)
    return key, signer


K = TypeVar("K", BrokerKey, SigningKey)


def _load_or_create(kind: type[K], path: Path, made: Made) -> K:
    if path.exists():
        return kind.load(path)
    return kind.create(path, made)


def _broker_key(backend: Backend, tables: Tables, key_file: Path, made: Made) -> BrokerKey:
    recorded = tables.meta("key_id")
    if recorded is None:
        key = _load_or_create(BrokerKey, key_file, made)
        tables.insert_meta("key_id", key.key_id)
        return key
    if not key_file.exists():
        raise _recorded_key_missing("broker key file", key_file, backend.where, "key_file")
    key = BrokerKey.load(key_file)
    if key.key_id != recorded:
        raise JournalError(
            f"broker key file {key_file} does not match journal {backend.where}: "
            + _OWN_KEY.format(setting="key_file")
        )
    return key


_OWN_KEY = (
    "name the journal's own with [journal] {setting} (a key file made anew would not match "
    "the key the journal records)"
)


def _recorded_key_missing(what: str, key_file: Path, where: str, setting: str) -> JournalError:
    """A journal that records a key whose file is not there: say where to look, not only
    that it is missing (the usual cause: a journal copied or moved without its key files)."""
    return JournalError(
        f"{what} {key_file} does not exist, but journal {where} records its key: restore the "
        "file the journal was made with (mode 0600), or " + _OWN_KEY.format(setting=setting)
    )


def _register(backend: Backend, tables: Tables, key_file: Path, made: Made) -> SigningKey:
    """A shared journal: this broker's key, registered if it is new to the journal.  A journal
    with rows must still end in a checkpoint some registered key signed."""
    signer = _load_or_create(SigningKey, key_file, made)
    keys = recorded_keys(tables)
    if signer.key_id not in keys:
        raw = base64.b64encode(signer.public_raw).decode("ascii")
        tables.insert_meta(REGISTERED + signer.key_id, raw)
        keys[signer.key_id] = signer.public_raw
    seq, h = tables.head()
    if seq:
        checkpoints.require_covered(tables, backend.where, seq, h, keys)
    return signer


def _single_signer(
    backend: Backend,
    tables: Tables,
    key_file: Path,
    clock: Callable[[], float],
    schema: str | None,
    made: Made,
) -> SigningKey:
    where = backend.where
    seq, h = tables.head()
    recorded = tables.meta("signing_key_id")
    if recorded is not None:
        if not key_file.exists():
            raise _recorded_key_missing("signing key file", key_file, where, "signing_key")
        signer = SigningKey.load(key_file)
        if signer.key_id != recorded:
            raise JournalError(
                f"signing key file {key_file} does not match journal {where} (it records key "
                f"{recorded}, the file holds {signer.key_id}): "
                + _OWN_KEY.format(setting="signing_key")
            )
        if seq:
            keys: Keys = {signer.key_id: signer.public_raw}
            checkpoints.require_covered(tables, where, seq, h, keys)
        return signer
    if seq:
        _refuse_removed(tables, where, key_file, schema)
    signer = _load_or_create(SigningKey, key_file, made)
    tables.insert_meta("signing_key_id", signer.key_id)
    tables.insert_meta("signing_public_key", base64.b64encode(signer.public_raw).decode("ascii"))
    if seq:
        checkpoints.adopt(tables, signer, clock)
    return signer


def _refuse_removed(tables: Tables, where: str, key_file: Path, schema: str | None) -> None:
    """Rows and no recorded signing key, yet a key file, checkpoints, or a schema or row only a
    signing broker writes: not a journal from before signing but one whose record of its key
    was removed (with the key file too, perhaps).  Adopting it would sign over whatever was
    done to it -- a full scan of its rows, paid once, by the open that would adopt it."""
    if key_file.exists():
        why: str | None = f"signing key file {key_file} exists"
    elif tables.checkpoint_count():
        why = "it has checkpoints"
    else:
        era_row = checkpoints.first_signing_era_row(tables.event_rows())
        why = checkpoints.signing_era(schema, tables.SIGNING_SCHEMA, era_row)
    if why is not None:
        raise SigningRecordsRemoved(
            f"journal {where} has rows but records no signing key, although {why}: its "
            "signing records were removed -- run `affidavit journal verify`; no broker signs "
            "over it"
        )
