"""The tools' input schemas and the action parser are one definition: what the published schema
accepts, the parser accepts -- or refuses with a check the field's description lists ("Also
refused: ... (CODE)").  And whatever the parser accepts, the schema accepts (a JSON null reads
as an absent field to the parser; the schema, stricter, never offers one).

Drawn both ways: values generated *from the schema* (``from_schema`` reads nothing else), and
arbitrary near-miss actions whose every refusal must be the schema's too, or a documented check.
(hypothesis-jsonschema would be the library for the first; its 0.23 does not run on current
hypothesis, and the subset the tools publish takes a screenful.)

Patterns are published in ECMA-262 form (``^(?:…)$``); Python's ``$`` also matches before a final
newline, so for Python's tools the end anchor is translated to ``\\Z`` -- the one difference
between the two dialects these patterns can meet.
"""

from __future__ import annotations

import copy
import string
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from affidavit.config import Config, load_config
from affidavit.protocols import get
from affidavit.protocols.actions import ActionInvalid, parse_action
from affidavit.protocols.catalog import catalog
from tests.broker.helpers import http_target, write_config

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"

TARGETS: dict[str, dict[str, Any]] = {
    "plain": http_target("http://127.0.0.1:9/base", methods=["GET", "POST"], max_body=64),
    "keyed": http_target(
        "http://127.0.0.1:9",
        methods=["PUT", "DELETE", "PATCH"],
        inject="header:X-Api-Key",
        max_body=200,
        idempotency={"header": "Idempotency-Key", "scope": "s", "retention": "1h"},
    ),
    "query": http_target("http://127.0.0.1:9", inject="query:api_key", max_body=0),
    "box": {
        "kind": "ssh",
        "host": "127.0.0.1",
        "user": "deploy",
        "host_key": HOST_KEY,
        "credential": "env:SSH_KEY",
        "max_stdin": 32,
    },
}


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    return load_config(write_config(tmp_path_factory.mktemp("schema"), TARGETS))


def python_dialect(schema: Any) -> Any:
    """The schema with each ``^(?:…)$`` pattern's end anchor as Python spells it (``\\Z``)."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            pattern = node.get("pattern")
            if isinstance(pattern, str):
                assert pattern.startswith("^(?:") and pattern.endswith(")$"), pattern
                node["pattern"] = pattern[:-1] + r"\Z"
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the schema accepts, for the subset ``affidavit.protocols.catalog`` publishes
    (Python dialect): enums, strings with ``maxLength`` and ``pattern``, objects of properties
    or of ``propertyNames`` / ``additionalProperties``."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("type", "string") == "string":
        size = min(schema.get("maxLength", 300), 300)
        pattern = schema.get("pattern")
        if pattern is None:
            return st.text(max_size=size)
        inner = pattern[len("^(?:") : -len(r")\Z")]
        return st.from_regex(inner, fullmatch=True).filter(
            lambda s: len(s) <= schema.get("maxLength", len(s))
        )
    if "properties" not in schema:
        names = from_schema({"type": "string", **schema.get("propertyNames", {})})
        values = from_schema(schema.get("additionalProperties", {}))
        return st.dictionaries(names, values, max_size=min(schema.get("maxProperties", 4), 4))
    required = set(schema.get("required", ()))
    # Each property's strategy built once, not at every draw: a ``from_regex`` made anew was
    # parsed and validated again for each example (half the test's time).
    properties = {name: from_schema(sub) for name, sub in schema["properties"].items()}

    @st.composite
    def objects(draw: st.DrawFn) -> dict[str, Any]:
        out = {}
        for name, strategy in properties.items():
            if name in required or draw(st.booleans()):
                out[name] = draw(strategy)
        return out

    return objects()


def tools(config: Config) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in catalog(config.targets, config.descriptions)["tools"]}


def documented(kind: str) -> set[tuple[str, str]]:
    """(code, field) of every refusal the published schema lists as beyond it."""
    spec = get(kind)
    assert spec is not None
    return {(code.value, f.name) for f in spec.action.schema for code, _ in f.checks}


def refusal(action: Any, config: Config) -> tuple[str, str] | None:
    try:
        parse_action(action, config)
    except ActionInvalid as exc:
        return exc.code.value, exc.field.split(".")[0]
    return None


def test_every_protocol_with_a_target_has_its_tool_and_every_field_is_declared(
    config: Config,
) -> None:
    found = tools(config)
    assert sorted(found) == ["http_request", "ssh_exec"]
    for tool in found.values():
        spec = get(tool["kind"])
        assert spec is not None
        props = tool["input_schema"]["properties"]
        assert set(props) == {"target", "session", *spec.action.fields}
        assert all("type" in p and p.get("description") for p in props.values())
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])
    assert found["http_request"]["input_schema"]["properties"]["target"]["enum"] == [
        "keyed",
        "plain",
        "query",
    ]


@pytest.mark.parametrize("tool", ["http_request", "ssh_exec"])
def test_what_the_schema_accepts_the_parser_accepts_or_refuses_as_documented(
    config: Config, tool: str
) -> None:
    published = tools(config)[tool]
    allowed = documented(published["kind"])

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(from_schema(python_dialect(published["input_schema"])))
    def check(action: dict[str, Any]) -> None:
        refused = refusal(action, config)
        assert refused is None or refused in allowed, (refused, action)

    check()


# Near misses: each declared field with values of every kind, plus stray keys.
_ODD_TEXT = st.text(alphabet=string.printable + "\x00\x7f\u00e9\u2028\ufeff", max_size=40)
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    _ODD_TEXT,
    st.sampled_from(["GET", "get", "/", "/a/../b", "//x", "/%zz", "/a?api_key=1", "ls", "  "]),
    st.sampled_from(["QUJD", "QUI=", "QQ==", "QUJ", "Q", "=", "ab\n"]),
    st.dictionaries(_ODD_TEXT, st.one_of(_ODD_TEXT, st.integers(), st.none()), max_size=3),
    st.lists(_ODD_TEXT, max_size=2),
)


@pytest.mark.parametrize("tool", ["http_request", "ssh_exec"])
def test_what_the_parser_refuses_the_schema_refuses_unless_documented(
    config: Config, tool: str
) -> None:
    published = tools(config)[tool]
    validator = jsonschema.Draft202012Validator(python_dialect(published["input_schema"]))
    allowed = documented(published["kind"])
    names = sorted(published["input_schema"]["properties"])

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        st.sampled_from(published["input_schema"]["properties"]["target"]["enum"]),
        st.dictionaries(st.sampled_from([*names, "Method", "extra"]), _VALUES, max_size=5),
    )
    def check(target: str, fields: dict[str, Any]) -> None:
        action = {"target": target, **fields}
        refused = refusal(action, config)
        # A declared field's null reads as absent (an unknown key is refused all the same).
        present = {k: v for k, v in action.items() if v is not None or k not in names}
        if refused is None:
            assert validator.is_valid(present), action
        elif refused not in allowed:
            assert not validator.is_valid(present), (refused, action)

    check()


def test_a_target_s_own_bound_is_documented_not_published(tmp_path: Path) -> None:
    """The schema publishes the largest ``max_body`` on offer; the smaller target refuses more
    with PAYLOAD_LIMIT, which its description lists."""
    config = load_config(write_config(tmp_path, {k: TARGETS[k] for k in ("plain", "keyed")}))
    body = tools(config)["http_request"]["input_schema"]["properties"]["body"]
    assert body["maxLength"] == 200
    assert "(PAYLOAD_LIMIT)" in body["description"]
    action = {"target": "plain", "method": "GET", "path": "/", "body": "x" * 100}
    assert refusal(action, config) == ("PAYLOAD_LIMIT", "body")


def _integer_params() -> list[tuple[str, str]]:
    from affidavit.mcp.tools import READ_TOOLS

    return [
        (tool.name, param.name)
        for tool in READ_TOOLS.values()
        for param in tool.params
        if param.type == "integer"
    ]


@pytest.mark.parametrize(("tool", "name"), _integer_params(), ids=lambda v: str(v))
@pytest.mark.parametrize("number", [5.0, 1e2, 5.5, float("inf"), -1.0, 1e300], ids=repr)
def test_a_read_tool_s_integer_agrees_with_the_schema_on_floats(
    tool: str, name: str, number: float
) -> None:
    """JSON Schema's integer accepts a number with no fraction (5.0, 1e2): so does the parser,
    reading it as the int it is (audit 53c: the schema said integer, the parser refused 5.0)."""
    from affidavit.mcp.tools import READ_TOOLS, ArgumentError

    read = READ_TOOLS[tool]
    param = next(p for p in read.params if p.name == name)
    args = {p.name: "act_1" for p in read.params if p.required and p.type == "string"}
    args[name] = number
    schema_ok = jsonschema.Draft202012Validator(read.input_schema()).is_valid(args)
    try:
        value = param.read(args)
    except ArgumentError:
        parser_ok = False
    else:
        parser_ok = True
        assert type(value) is int and value == number
    assert parser_ok == schema_ok, (args, read.input_schema())
    if number in (5.0, 1e2):
        assert parser_ok
