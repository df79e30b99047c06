"""Each config field is declared once (issue 8, item 6): parsing, unknown-key errors, the snapshot
that CONFIG_CHANGED compares and the docs tables all come from the ``Field`` declarations.

Seed, "Validation and credential injection finish before dispatch": "bind the normalized target
... If any bound value changes, create a new invocation" — so a new setting must be part of the
binding unless somebody declares, with a reason, that it cannot change what is sent or to whom.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from affidavit.config import SERVICE, config_from_dict, sample_config
from affidavit.config.loader import JOURNAL, VAULT
from affidavit.protocols import registered
from affidavit.protocols.actions import legacy_fingerprint, parse_action
from affidavit.protocols.http import HTTP_TARGET
from affidavit.protocols.http.batch import BATCH
from affidavit.protocols.http.operations import OPERATIONS
from affidavit.protocols.ssh import SSH_TARGET
from affidavit.schema import (
    COMMON,
    ConfigError,
    Field,
    LoadContext,
    Read,
    Section,
    TargetSchema,
    Timeouts,
    canonical_json,
    doc_table,
    snapshot,
    snapshot_hash,
    trust_anchors,
)

ROOT = Path(__file__).resolve().parents[2]
CONTEXT = LoadContext(Path("/etc/affidavit"))
HOST = Field("host", lambda r: r.string(), doc="where")


def _target_class(*extra: str) -> type:
    """A fresh frozen target dataclass with ``host``, the common attributes and ``extra``."""
    attrs: list[Any] = [("name", str), ("host", str), ("credential", str), ("budget", int)]
    attrs += [("timeout", Timeouts), ("max_result", Any)]
    attrs += [*((a, Any) for a in extra), ("kind", str, "box")]
    return dataclasses.make_dataclass("Box", attrs, frozen=True)


def _load(schema: TargetSchema[Any], **settings: Any) -> Any:
    table = {"kind": "box", "host": "a.example", "credential": "env:T", **settings}
    return schema.read_target("t", Section(table, "targets.t"), CONTEXT)


def test_a_field_added_to_a_schema_is_bound_by_the_snapshot() -> None:
    colour = Field("colour", lambda r: r.string(), default="red", doc="a new setting")
    schema = TargetSchema("box", _target_class("colour"), (HOST, *COMMON, colour))
    red, blue = _load(schema), _load(schema, colour="blue")
    # Nobody listed "colour" anywhere else: declaring it is what puts it in the binding.
    assert snapshot(red)["colour"] == "red"
    assert snapshot(blue)["colour"] == "blue"
    assert snapshot_hash(red) != snapshot_hash(blue)
    assert set(snapshot(red)) == {
        "kind",
        "name",
        "host",
        "credential",
        "budget",
        "timeout",
        "colour",
    }


def test_leaving_a_field_out_of_the_snapshot_needs_a_declared_reason() -> None:
    with pytest.raises(ValueError, match="non-binding without a reason"):
        Field("label", Read.string, default="x", binding=False)
    with pytest.raises(ValueError, match="only for binding=False"):
        Field("label", Read.string, default="x", reason="a binding field needs no excuse")
    label = Field(
        "label",
        lambda r: r.string(),
        default="x",
        binding=False,
        reason="shown to operators only; never sent",
    )
    schema = TargetSchema("box", _target_class("label"), (HOST, *COMMON, label))
    a, b = _load(schema, label="one"), _load(schema, label="two")
    assert a.label == "one" and "label" not in snapshot(a)
    assert snapshot_hash(a) == snapshot_hash(b)


def test_an_attribute_without_a_field_cannot_bypass_the_declaration() -> None:
    with pytest.raises(TypeError, match=r"attributes without a field: \['colour'\]"):
        TargetSchema("box", _target_class("colour"), (HOST, *COMMON))
    with pytest.raises(TypeError, match=r"fields without an attribute: \['colour'\]"):
        TargetSchema("box", _target_class(), (HOST, *COMMON, Field("colour", Read.string)))
    with pytest.raises(TypeError, match="leaves out common fields"):
        TargetSchema("box", _target_class(), (HOST,))


def test_parsing_and_unknown_keys_follow_the_declaration() -> None:
    port = Field("port", lambda r: r.integer(1, 65535), default=7, doc="TCP port")
    schema = TargetSchema("box", _target_class("port"), (HOST, port, *COMMON))
    assert _load(schema).port == 7
    with pytest.raises(ConfigError) as info:
        _load(schema, port=0)
    assert (info.value.field, info.value.message) == (
        "targets.t.port",
        "must be between 1 and 65535",
    )
    with pytest.raises(ConfigError) as info:
        _load(schema, prot=8)
    assert info.value.field == "targets.t.prot"
    allowed = "kind, description, host, port, credential, budget, timeout, max_result"
    assert info.value.message == f"unknown setting (allowed: {allowed})"


@pytest.mark.parametrize("kind", ["http", "ssh"])
def test_every_attribute_of_a_builtin_target_is_bound(kind: str) -> None:
    schema = registered()[kind].target
    attrs = {f.name for f in dataclasses.fields(schema.cls)}  # type: ignore[arg-type]
    # The one exception: SSH's ``known_hosts`` path, kept for the start's exposure check
    # (``trust_anchor``); the keys read from it are ``host_keys``, which binds.
    unbound = [f.name for f in schema.fields if not f.binding]
    assert unbound == (["known_hosts"] if kind == "ssh" else [])
    assert {"kind", "name", *(f.name for f in schema.fields)} == attrs


@pytest.mark.parametrize(
    ("section", "fields"),
    [
        ("[journal]", JOURNAL.fields),
        ("[vault]", VAULT.fields),
        ("[service]", SERVICE.fields),
        ("Settings every target has", COMMON),
        ("HTTP targets", HTTP_TARGET.own_fields),
        ("SSH targets", SSH_TARGET.own_fields),
        ("Asynchronous jobs: `operations`", OPERATIONS.fields),
        ("Batches: `batch`", BATCH.fields),
    ],
)
def test_configuration_docs_list_every_declared_key(section: str, fields: Any) -> None:
    """docs/configuration.md shows each table exactly as the declarations generate it (no key
    missing, none extra, defaults as declared)."""
    doc = (ROOT / "docs/configuration.md").read_text(encoding="utf-8")
    heading = doc.index(section)
    assert f"\n\n{doc_table(fields)}\n\n" in doc[heading:]
    for key in (k for f in fields for k in _table_keys(f)):
        assert f"`{key}`" in doc[heading:], key  # a table-valued setting's keys, in the text


def _table_keys(field: Field) -> tuple[str, ...]:
    """The keys of a table-valued field (its parser is ``Schema.parse_table`` of a schema)."""
    owner = getattr(field.parse, "__self__", None)
    return tuple(getattr(owner, "keys", ()))


def test_a_field_declared_a_trust_anchor_names_its_file_and_what_it_is() -> None:
    """``trust_anchors`` is what a broker's start checks (``api.broker.exposed_files``): each
    set field declared ``trust_anchor``, its path resolved against the config's directory."""
    pins = Field(
        "pins",
        lambda r: r.resolve_path(r.string()) if r.present else None,
        default=None,
        doc="pinned keys",
        trust_anchor="pin file",
    )
    schema = TargetSchema("box", _target_class("pins"), (HOST, *COMMON, pins))
    assert trust_anchors(_load(schema, pins="pins.txt")) == (
        (Path("/etc/affidavit/pins.txt"), "pin file"),
    )
    assert trust_anchors(_load(schema)) == ()
    words = Field("words", lambda r: r.string(), default="", doc="no path", trust_anchor="x")
    bad = TargetSchema("box", _target_class("words"), (HOST, *COMMON, words))
    with pytest.raises(TypeError, match="trust anchor field 'words' holds no Path"):
        trust_anchors(_load(bad, words="a"))


def test_the_docs_name_every_trust_anchor_the_start_checks() -> None:
    """Each built-in trust anchor -- and the auditor's public key -- is named where the
    exposure check is explained: deployment's "Files others can reach", security's "Who else
    can reach", configuration's FILES_EXPOSED row."""
    docs = {
        name: (ROOT / "docs" / name).read_text(encoding="utf-8")
        for name in ("deployment.md", "security.md", "configuration.md")
    }
    deployment = docs["deployment.md"]
    places = {
        "deployment": deployment[deployment.index("### Files others can reach") :],
        "security": docs["security.md"].split("### Who else can reach")[1].split("\n### ")[0],
        "configuration": next(
            line
            for line in docs["configuration.md"].splitlines()
            if line.startswith("| `FILES_EXPOSED`")
        ),
    }
    anchors = [f for t in (HTTP_TARGET, SSH_TARGET) for f in t.fields if f.trust_anchor]
    assert sorted(f.key for f in anchors) == ["ca_file", "known_hosts"]
    for where, text in places.items():
        for key in (*(f.key for f in anchors), "auditor_public_key"):
            assert f"`{key}`" in text, (where, key)
    for f in anchors:
        assert f"`{f.trust_anchor} of target" in places["deployment"], f.trust_anchor
    assert "`auditor public key file`" in places["deployment"]


def test_the_snapshot_hash_of_an_unhashable_target_is_computed_each_time() -> None:
    """Hashes are remembered per (frozen, hashable) target; a target holding a list is not
    hashable and must still be bound by its current value."""
    tags = Field("tags", lambda r: r.string_list(), default=[], doc="labels")
    schema = TargetSchema("box", _target_class("tags"), (HOST, *COMMON, tags))
    a, b = _load(schema, tags=["x"]), _load(schema, tags=["y"])
    with pytest.raises(TypeError):
        hash(a)
    assert snapshot_hash(a) != snapshot_hash(b)
    assert snapshot_hash(a) == snapshot_hash(_load(schema, tags=["x"]))


def test_hashes_recorded_before_the_declarations_still_match() -> None:
    """Journals written before the snapshot was derived hold these values (computed by the
    hand-written snapshot); since the config hash is keyed, a same-key retry recognizes them
    as the same request bound by an earlier version (CONFIG_CHANGED, not a mismatch), so the
    plain hash and the v1 fingerprint must not move."""
    config = config_from_dict(tomllib.loads(sample_config()), base_dir=Path("/elsewhere"))
    example, deploy = config.targets["example"], config.targets["deploy"]
    assert snapshot_hash(example) == (
        "sha256:53f9bd9989f0d9099238d8220ed18606f28a218f7f4194e4b1324c66c0295580"
    )
    assert snapshot_hash(deploy) == (
        "sha256:c8f803da609547ee049f2ff6a4732bc1895647d3d7afab208061c52fffe85bab"
    )
    post = {"target": "example", "method": "POST", "path": "/charges", "headers": {"X-A": "1"}}
    assert legacy_fingerprint(parse_action({**post, "body": "{}"}, config), example) == (
        "sha256:b77edd69e5c149204ee54139945e3e6dbfd08a606fc426f34d4427c2014d3c65"
    )
    run = parse_action({"target": "deploy", "command": "uptime", "stdin": "x"}, config)
    assert legacy_fingerprint(run, deploy) == (
        "sha256:c4e121c56a0b13d8d32da92a7a303af6c6c504bfeb178f9061bfb51e8c2f82c2"
    )


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(_JSON)
def test_canonical_json_is_json_dumps_sorted_and_compact(value: Any) -> None:
    """``canonical_json`` makes its C encoder once (issue 15): the bytes it hashes -- every
    fingerprint and config hash -- are still exactly those of ``json.dumps`` with its
    arguments, and what that refuses it refuses."""
    want = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    assert canonical_json(value) == want.encode("utf-8")


def test_canonical_json_refuses_what_json_dumps_refuses() -> None:
    for bad in (float("nan"), {"x": math.inf}, {1j: 1}, object()):
        with pytest.raises((TypeError, ValueError)):
            canonical_json(bad)


def test_every_option_a_field_offers_is_used_by_a_declaration() -> None:
    """An option no schema sets is a promise nothing keeps (``Field.also`` documented further
    keys a field reads, long after the one field that did got a field of its own): each of
    ``Field``'s options is given by some ``Field(...)`` of the broker's or the toy protocol's
    (the example a protocol author copies)."""
    root = Path(__file__).resolve().parents[2]
    given: set[str] = set()
    for where in (root / "affidavit", root / "tests" / "toy_protocol"):
        for path in where.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Field":
                    given.update(k.arg for k in node.keywords if k.arg)
                    given.update(f.name for f in dataclasses.fields(Field)[: len(node.args)])
    options = {f.name for f in dataclasses.fields(Field)}
    assert options - given == set()
