"""What a caller may know before calling: the configured targets and, per protocol, the JSON
Schema of its action -- derived from the protocol's own declarations, never written twice.

``catalog(targets, descriptions)`` is what ``Broker.catalog()`` returns and the daemon serves
(``GET /v1/catalog``), so an interface that holds no config -- ``affidavit mcp --socket`` -- builds
its tools from the very registry that will parse the calls.  A protocol registered through its
entry point gets a tool here without an edit: its ``ActionSpec`` names the tool and declares its
fields (``ActionField``); one that declares none gets a schema naming its fields only.

Schemas are JSON Schema 2020-12 in the subset tool clients read: each tool's input is one object
of typed properties, ``required`` and ``additionalProperties: false``; patterns are written in
the common subset of Python's ``re`` and ECMA-262 and anchored ``^(?:…)$``.  What a schema cannot
say (a bound a target sets, a rule across fields, a check of meaning) is listed in the field's
description as "Also refused", with the code the parser gives it -- tests/mcp proves that every
value the schema accepts is accepted by the parser or refused by one of those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .actions import SESSION_FIELD, action_size_limit
from .registry import get
from .spec import ActionField, ProtocolSpec

__all__ = ["catalog", "field_schema", "input_schema", "target_entry", "tool_name"]


def tool_name(spec: ProtocolSpec) -> str:
    return spec.action.tool or f"{spec.kind}_call"


def field_schema(field: ActionField, targets: Iterable[Any] = ()) -> dict[str, Any]:
    """One property's schema, its description ending with the refusals the schema cannot say."""
    out: dict[str, Any] = {"type": field.type}
    doc = field.doc
    if field.checks:
        doc += ". Also refused: " + "; ".join(f"{why} ({code.value})" for code, why in field.checks)
    if doc:
        out["description"] = doc
    bound = field.max_length
    if field.limit is not None:
        limits = [field.limit(t) for t in targets]
        bound = max(limits) if limits else bound
    if field.type == "string":
        if bound is not None:
            out["maxLength"] = bound
        if field.pattern is not None:
            out["pattern"] = f"^(?:{field.pattern})$"
    else:
        if bound is not None:
            out["maxProperties"] = bound
        if field.keys is not None:
            out["propertyNames"] = _bare(field_schema(field.keys))
        if field.values is not None:
            out["additionalProperties"] = field_schema(field.values)
    return out


def _bare(schema: dict[str, Any]) -> dict[str, Any]:
    # ``propertyNames`` applies to strings by definition; its ``type`` would only repeat it.
    return {k: v for k, v in schema.items() if k != "type"}


def input_schema(spec: ProtocolSpec, targets: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON Schema of ``spec``'s action over ``targets`` (those of its kind, by name)."""
    props: dict[str, Any] = {
        "target": {
            "type": "string",
            "enum": sorted(targets),
            "description": "a configured target of this kind (list_targets describes each)",
        }
    }
    required = ["target"]
    declared = {f.name: f for f in spec.action.schema}
    for name in sorted(spec.action.fields, key=lambda n: _order(spec, n)):
        field = declared.get(name)
        if field is None:
            props[name] = {"description": f"see the {spec.kind} protocol's documentation"}
            continue
        props[name] = field_schema(field, targets.values())
        if field.required:
            required.append(name)
    props["session"] = field_schema(SESSION_FIELD)
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def _order(spec: ProtocolSpec, name: str) -> tuple[int, str]:
    names = [f.name for f in spec.action.schema]
    return (names.index(name), name) if name in names else (len(names), name)


def target_entry(target: Any, description: str = "") -> dict[str, Any]:
    """A target as its callers see it: name, kind, description, what its protocol's
    ``describe`` lists (an allow-list: no credential reference ever), its budget and timeouts."""
    spec = get(target.kind)
    entry: dict[str, Any] = {"name": target.name, "kind": target.kind}
    entry["description"] = description
    if spec is not None and spec.describe is not None:
        entry.update(spec.describe(target))
    # What every target has (affidavit.schema.COMMON), but never its credential.
    entry["budget"] = target.budget
    entry["timeout"] = {"connect": target.timeout.connect, "total": target.timeout.total}
    # What a caller must plan for: a call that waits for a human (APPROVAL_PENDING past
    # ``wait``, then fetch_result), and whether an ``unknown`` outcome can be settled by the
    # target's own reconciliation query (docs/approvals.md).
    entry["approval"] = _approval(getattr(target, "approval", None))
    entry["reconcile_query"] = getattr(target, "reconcile", None) is not None
    return entry


def _approval(policy: Any) -> dict[str, Any] | None:
    if policy is None:
        return None
    shown: dict[str, Any] = {"ttl": policy.ttl, "wait": policy.wait}
    if policy.always:
        shown["always"] = True
    if policy.methods is not None:
        shown["methods"] = sorted(policy.methods)
    if policy.commands is not None:
        shown["commands"] = list(policy.commands)
    if getattr(policy, "except_commands", None) is not None:
        shown["except_commands"] = list(policy.except_commands)
    return shown


def catalog(targets: Mapping[str, Any], descriptions: Mapping[str, str]) -> dict[str, Any]:
    """``{"targets": [...], "tools": [{"name", "kind", "doc", "input_schema"}],
    "max_action_bytes"}``: one tool per protocol that has a configured target, and the bytes of
    action JSON worth reading for these targets (``action_size_limit``)."""
    by_kind: dict[str, dict[str, Any]] = {}
    for name, target in targets.items():
        by_kind.setdefault(target.kind, {})[name] = target
    tools = []
    for kind in sorted(by_kind):
        spec = get(kind)
        if spec is None:
            continue
        tools.append(
            {
                "name": tool_name(spec),
                "kind": kind,
                "doc": spec.action.doc,
                "input_schema": input_schema(spec, by_kind[kind]),
            }
        )
    return {
        "targets": [target_entry(t, descriptions.get(n, "")) for n, t in sorted(targets.items())],
        "tools": tools,
        "max_action_bytes": action_size_limit(targets.values()),
    }
