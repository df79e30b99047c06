"""Action validation, fingerprint and idempotency-by-configuration.

Seed, "Validation and credential injection finish before dispatch": every deterministic mistake
gets a stable code and the field path to fix; nothing but ``ActionInvalid`` ever escapes, whatever
JSON the caller sends.  The fingerprint binds the request to the target snapshot so that a change
of body, path, method, headers or target configuration is a different request.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from affidavit.config import Config, config_from_dict, snapshot_hash
from affidavit.protocols.actions import ActionInvalid, fingerprint, is_idempotent, parse_action
from affidavit.protocols.http import HttpAction, HttpTarget, full_path
from affidavit.protocols.ssh import SshAction, SshTarget
from affidavit.statemachine import CODES, Code, Outcome, Phase

_blob = struct.pack(">I", 11) + b"ssh-ed25519" + struct.pack(">I", 32) + bytes(32)
HOST_KEY = "ssh-ed25519 " + base64.b64encode(_blob).decode()


def make_config() -> Config:
    return config_from_dict(
        {
            "vault": {"path": "v.vault"},
            "targets": {
                "billing": {
                    "kind": "http",
                    "url": "https://billing.example.com/api",
                    "methods": ["GET", "POST", "PUT"],
                    "idempotent": ["GET", "PUT"],
                    "credential": "env:BILLING_TOKEN",
                    "inject": "header:X-Api-Key",
                    "max_body": 16,
                    "idempotency": {
                        "header": "Idempotency-Key",
                        "scope": "payments.create",
                        "retention": "24h",
                    },
                },
                "search": {
                    "kind": "http",
                    "url": "http://127.0.0.1:8080",
                    "methods": ["GET"],
                    "credential": "env:SEARCH_KEY",
                    "inject": "query:api_key",
                },
                "deploy": {
                    "kind": "ssh",
                    "host": "127.0.0.1",
                    "user": "deploy",
                    "host_key": HOST_KEY,
                    "credential": "vault:deploy_key",
                    "idempotent_commands": ["systemctl is-active app"],
                    "max_stdin": 8,
                },
            },
        },
        base_dir=Path("/tmp"),
    )


CONFIG = make_config()


def http(**over: Any) -> dict[str, Any]:
    action: dict[str, Any] = {"target": "billing", "method": "POST", "path": "/v1/charges"}
    action.update(over)
    return {k: v for k, v in action.items() if v is not ...}


def ssh(**over: Any) -> dict[str, Any]:
    action: dict[str, Any] = {"target": "deploy", "command": "deploy --release r1"}
    action.update(over)
    return {k: v for k, v in action.items() if v is not ...}


def invalid(action: object, config: Config = CONFIG) -> ActionInvalid:
    with pytest.raises(ActionInvalid) as info:
        parse_action(action, config)
    return info.value


# --- valid actions --------------------------------------------------------------------------


def test_http_action_is_normalized() -> None:
    action = parse_action(
        http(
            method="post",
            headers={"X-B": "2", "Accept": "application/json", "x-a": "1"},
            body='{"amount": 5}',
            idempotency_key="req_01",
            session="s1",
        ),
        CONFIG,
    )
    assert action == HttpAction(
        target="billing",
        method="POST",
        path="/v1/charges",
        headers=(("accept", "application/json"), ("x-a", "1"), ("x-b", "2")),
        body=b'{"amount": 5}',
        idempotency_key="req_01",
        session="s1",
    )
    assert full_path(action, CONFIG.targets["billing"]) == "/api/v1/charges"  # type: ignore[arg-type]


def test_body_base64_and_empty_body() -> None:
    a = parse_action(http(body_base64=base64.b64encode(b"\x00\xff").decode()), CONFIG)
    assert isinstance(a, HttpAction) and a.body == b"\x00\xff"
    b = parse_action(http(body=None, headers=None, session=None), CONFIG)
    assert isinstance(b, HttpAction) and b.body == b"" and b.headers == ()


def test_ssh_action() -> None:
    action = parse_action(ssh(stdin="hi\n", session="s"), CONFIG)
    assert action == SshAction("deploy", "deploy --release r1", b"hi\n", "s")
    assert parse_action(ssh(), CONFIG) == SshAction("deploy", "deploy --release r1", None, None)


def test_query_path_is_allowed_when_it_does_not_touch_the_credential_param() -> None:
    a = parse_action({"target": "search", "method": "GET", "path": "/q?term=a%20b&page=2"}, CONFIG)
    assert isinstance(a, HttpAction) and a.path == "/q?term=a%20b&page=2"


def test_encoded_separators_and_dotted_names_stay_allowed() -> None:
    # Only a decoded "." or ".." segment climbs; an encoded slash between names, "..." and
    # "a..b" do not.
    for path in ("/files/a%2Fb", "/v1/a..b", "/v1/...", "/v1/.well-known", "/v1/x%5Cy"):
        a = parse_action(http(path=path), CONFIG)
        assert isinstance(a, HttpAction) and a.path == path


# --- every error code with its field path -----------------------------------------------------

CASES: list[tuple[object, Code, str]] = [
    # shape
    ([], Code.INVALID_FIELD, "action"),
    ("GET /", Code.INVALID_FIELD, "action"),
    (None, Code.INVALID_FIELD, "action"),
    ({1: "x"}, Code.INVALID_FIELD, "action"),
    # target
    (http(target=...), Code.MISSING_FIELD, "target"),
    (http(target=None), Code.MISSING_FIELD, "target"),
    (http(target=5), Code.INVALID_FIELD, "target"),
    (http(target="nope"), Code.INVALID_TARGET, "target"),
    (http(target="billing\n"), Code.INVALID_FIELD, "target"),
    # unknown / foreign fields
    (http(idempotencyKey="k"), Code.INVALID_FIELD, "idempotencyKey"),
    (http(**{"x" * 100: 1}), Code.INVALID_FIELD, "action"),
    (http(command="ls"), Code.UNSUPPORTED_ACTION, "command"),
    (http(stdin="x"), Code.UNSUPPORTED_ACTION, "stdin"),
    (ssh(method="GET"), Code.UNSUPPORTED_ACTION, "method"),
    (ssh(path="/"), Code.UNSUPPORTED_ACTION, "path"),
    (ssh(headers={}), Code.UNSUPPORTED_ACTION, "headers"),
    (ssh(body="x"), Code.UNSUPPORTED_ACTION, "body"),
    # an SSH key is the caller's identifier of the effect (bound, never sent): checked alike
    (ssh(idempotency_key=5), Code.INVALID_FIELD, "idempotency_key"),
    (ssh(idempotency_key="has space"), Code.INVALID_FIELD, "idempotency_key"),
    # method
    (http(method=...), Code.MISSING_FIELD, "method"),
    (http(method=1), Code.INVALID_FIELD, "method"),
    (http(method="GE T"), Code.INVALID_FIELD, "method"),
    (http(method="DELETE"), Code.UNSUPPORTED_ACTION, "method"),
    (http(method="POST\r\n"), Code.INVALID_FIELD, "method"),
    # path
    (http(path=...), Code.MISSING_FIELD, "path"),
    (http(path=["/"]), Code.INVALID_FIELD, "path"),
    (http(path="v1/charges"), Code.INVALID_FIELD, "path"),
    (http(path="//evil.example/x"), Code.INVALID_FIELD, "path"),
    (http(path="https://evil.example/x"), Code.INVALID_FIELD, "path"),
    (http(path="/x\r\nHost: evil"), Code.INVALID_FIELD, "path"),
    (http(path="/x\x00"), Code.INVALID_FIELD, "path"),
    (http(path="/a b"), Code.INVALID_FIELD, "path"),
    (http(path="/a#frag"), Code.INVALID_FIELD, "path"),
    (http(path="/a\\b"), Code.INVALID_FIELD, "path"),
    (http(path="/ü"), Code.INVALID_FIELD, "path"),
    (http(path="/a%zz"), Code.INVALID_FIELD, "path"),
    (http(path="/../admin"), Code.INVALID_FIELD, "path"),
    (http(path="/a/%2e%2E/admin"), Code.INVALID_FIELD, "path"),
    # an encoded separator inside a segment: "..%2Fadmin" is "../admin" to a server that
    # decodes %2F (or %5C) before normalizing
    (http(path="/..%2Fadmin"), Code.INVALID_FIELD, "path"),
    (http(path="/a/%2e%2e%2fadmin"), Code.INVALID_FIELD, "path"),
    (http(path="/a/..%5Cadmin"), Code.INVALID_FIELD, "path"),
    (http(path="/a/x%2F.%2Fy"), Code.INVALID_FIELD, "path"),
    (http(path="/a/./b"), Code.INVALID_FIELD, "path"),
    # a dot segment with path parameters: "..;x" is ".." to a server that drops them before
    # normalizing (Tomcat, Jetty, Spring)
    (http(path="/a/..;/admin"), Code.INVALID_FIELD, "path"),
    (http(path="/a/..;x=1/admin"), Code.INVALID_FIELD, "path"),
    (http(path="/a/.;x/b"), Code.INVALID_FIELD, "path"),
    (http(path="/a/%2e%2e%3B/admin"), Code.INVALID_FIELD, "path"),
    (http(path="/" + "a" * 9000), Code.PAYLOAD_LIMIT, "path"),
    (
        {"target": "search", "method": "GET", "path": "/q?api_key=mine"},
        Code.FORBIDDEN_HEADER,
        "path",
    ),
    (
        {"target": "search", "method": "GET", "path": "/q?a=1&api%5Fkey=x"},
        Code.FORBIDDEN_HEADER,
        "path",
    ),
    # headers
    (http(headers=[["a", "b"]]), Code.INVALID_FIELD, "headers"),
    (http(headers={"Bad Name": "x"}), Code.INVALID_FIELD, "headers"),
    (http(headers={"X-Foo": 5}), Code.INVALID_FIELD, "headers.X-Foo"),
    (http(headers={"X-Foo": "a\r\nb: c"}), Code.INVALID_FIELD, "headers.X-Foo"),
    (http(headers={"X-Foo": "a\nb"}), Code.INVALID_FIELD, "headers.X-Foo"),
    (http(headers={"X-Foo": "a\x00"}), Code.INVALID_FIELD, "headers.X-Foo"),
    (http(headers={"X-Foo": " padded"}), Code.INVALID_FIELD, "headers.X-Foo"),
    (http(headers={"X-Foo": "é"}), Code.INVALID_FIELD, "headers.X-Foo"),
    (http(headers={"X-Foo": "a", "x-foo": "b"}), Code.INVALID_FIELD, "headers.x-foo"),
    (http(headers={"X-Foo": "a" * 9000}), Code.PAYLOAD_LIMIT, "headers.X-Foo"),
    (http(headers={f"X-{i}": "v" for i in range(65)}), Code.PAYLOAD_LIMIT, "headers"),
    (
        http(headers={"Authorization": "Bearer mine"}),
        Code.FORBIDDEN_HEADER,
        "headers.Authorization",
    ),
    (
        http(headers={"proxy-authorization": "x"}),
        Code.FORBIDDEN_HEADER,
        "headers.proxy-authorization",
    ),
    (http(headers={"Cookie": "a=b"}), Code.FORBIDDEN_HEADER, "headers.Cookie"),
    (http(headers={"X-API-KEY": "mine"}), Code.FORBIDDEN_HEADER, "headers.X-API-KEY"),
    (http(headers={"idempotency-key": "k"}), Code.FORBIDDEN_HEADER, "headers.idempotency-key"),
    (http(headers={"Host": "evil"}), Code.FORBIDDEN_HEADER, "headers.Host"),
    (http(headers={"Content-Length": "0"}), Code.FORBIDDEN_HEADER, "headers.Content-Length"),
    (
        http(headers={"Transfer-Encoding": "chunked"}),
        Code.FORBIDDEN_HEADER,
        "headers.Transfer-Encoding",
    ),
    (http(headers={"Connection": "close"}), Code.FORBIDDEN_HEADER, "headers.Connection"),
    # body
    (http(body=5), Code.INVALID_FIELD, "body"),
    (http(body="x" * 17), Code.PAYLOAD_LIMIT, "body"),
    (http(body="é" * 9), Code.PAYLOAD_LIMIT, "body"),  # 18 UTF-8 bytes
    (http(body="\ud800"), Code.INVALID_FIELD, "body"),
    (http(body="a", body_base64="YQ=="), Code.INVALID_FIELD, "body_base64"),
    (http(body_base64="not base64!"), Code.INVALID_FIELD, "body_base64"),
    (http(body_base64="é"), Code.INVALID_FIELD, "body_base64"),
    (http(body_base64=7), Code.INVALID_FIELD, "body_base64"),
    (http(body_base64=base64.b64encode(b"x" * 17).decode()), Code.PAYLOAD_LIMIT, "body_base64"),
    (http(body_base64="A" * 1000), Code.PAYLOAD_LIMIT, "body_base64"),
    # idempotency key
    (
        {"target": "search", "method": "GET", "path": "/", "idempotency_key": "k"},
        Code.UNSUPPORTED_ACTION,
        "idempotency_key",
    ),
    (http(idempotency_key=5), Code.INVALID_FIELD, "idempotency_key"),
    (http(idempotency_key="has space"), Code.INVALID_FIELD, "idempotency_key"),
    (http(idempotency_key="k\r\n"), Code.INVALID_FIELD, "idempotency_key"),
    (http(idempotency_key="k" * 256), Code.INVALID_FIELD, "idempotency_key"),
    # session
    (http(session=1), Code.INVALID_FIELD, "session"),
    (http(session="s\n"), Code.INVALID_FIELD, "session"),
    (http(session="x" * 256), Code.INVALID_FIELD, "session"),
    # ssh
    (ssh(command=...), Code.MISSING_FIELD, "command"),
    (ssh(command=["ls"]), Code.INVALID_FIELD, "command"),
    (ssh(command="  "), Code.INVALID_FIELD, "command"),
    (ssh(command="ls\nrm -rf /"), Code.INVALID_FIELD, "command"),
    (ssh(command="ls\x00"), Code.INVALID_FIELD, "command"),
    (ssh(command="\udc80"), Code.INVALID_FIELD, "command"),
    (ssh(command="x" * 40000), Code.PAYLOAD_LIMIT, "command"),
    (ssh(stdin=b"bytes"), Code.INVALID_FIELD, "stdin"),
    (ssh(stdin="123456789"), Code.PAYLOAD_LIMIT, "stdin"),
    (ssh(stdin="éééé" + "é"), Code.PAYLOAD_LIMIT, "stdin"),
    (ssh(stdin="\ud800"), Code.INVALID_FIELD, "stdin"),
]


@pytest.mark.parametrize(("action", "code", "field"), CASES)
def test_error_code_and_field_path(action: object, code: Code, field: str) -> None:
    err = invalid(action)
    assert (err.code, err.field) == (code, field), err.message
    # every code used here is a validation code: phase=validation, outcome=not_attempted
    assert CODES[err.code].phase is Phase.VALIDATION
    assert CODES[err.code].outcome is Outcome.NOT_ATTEMPTED
    assert err.message and "\n" not in str(err)


def test_unknown_target_message_never_echoes_the_callers_string() -> None:
    canary = "vault:ghp_CANARY_4a7c0ffee"
    err = invalid(http(target=canary))
    assert err.code is Code.INVALID_TARGET
    assert canary not in str(err) and canary not in repr(err)
    assert "billing" in err.message  # the configured names help the caller fix it


def test_forbidden_header_values_are_not_echoed() -> None:
    canary = "Bearer CANARY_caller_token"
    err = invalid(http(headers={"Authorization": canary}))
    assert canary not in str(err)


def test_idempotency_header_is_only_forbidden_with_a_contract() -> None:
    a = parse_action(
        {"target": "search", "method": "GET", "path": "/", "headers": {"Idempotency-Key": "k"}},
        CONFIG,
    )
    assert isinstance(a, HttpAction) and a.headers == (("idempotency-key", "k"),)


# --- hypothesis: junk never escapes as anything but ActionInvalid -----------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
_field_names = st.sampled_from(
    ["target", "method", "path", "headers", "body", "body_base64", "idempotency_key",
     "session", "command", "stdin", "extra"]
)  # fmt: skip
_targets = st.sampled_from(["billing", "search", "deploy", "nope"])
_strings = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["GET", "POST", "/", "/v1/x", "/../x", "//h/x", "a\r\nb", "ls", "YQ=="]),
)
_actions = st.fixed_dictionaries(
    {"target": _targets},
    optional={
        name: st.one_of(_json, _strings, st.dictionaries(_strings, _strings, max_size=3))
        for name in ["method", "path", "headers", "body", "body_base64", "idempotency_key",
                     "session", "command", "stdin", "extra"]
    },
)  # fmt: skip


def _check(obj: object) -> None:
    try:
        result = parse_action(obj, CONFIG)
    except ActionInvalid as exc:
        assert isinstance(exc.code, Code)
        assert CODES[exc.code].phase is Phase.VALIDATION
        assert isinstance(exc.field, str) and exc.field
        return
    assert isinstance(result, HttpAction | SshAction)
    json.dumps(dataclasses.asdict(result), default=lambda b: b.hex())


@settings(max_examples=300, deadline=None)
@given(st.one_of(_json, st.dictionaries(_field_names, _json, max_size=8)))
def test_junk_json_only_raises_action_invalid(obj: object) -> None:
    _check(obj)


@settings(max_examples=300, deadline=None)
@given(_actions)
def test_near_miss_actions_only_raise_action_invalid(obj: dict[str, Any]) -> None:
    _check(obj)


# --- fingerprint ------------------------------------------------------------------------------


def fp(action: dict[str, Any], config: Config = CONFIG) -> str:
    parsed = parse_action(action, config)
    target = config.targets[parsed.target]
    return fingerprint(parsed, target, snapshot_hash(target))


def test_fingerprint_is_stable_and_canonical() -> None:
    a = fp(http(headers={"X-A": "1", "X-B": "2"}, body="b"))
    b = fp({"body": "b", "headers": {"x-b": "2", "X-A": "1"}, "path": "/v1/charges",
            "method": "post", "target": "billing"})  # fmt: skip
    assert a == b
    assert a.startswith("sha256:") and len(a) == len("sha256:") + 64
    # body and body_base64 with the same bytes are the same request
    assert fp(http(body="b")) == fp(http(body_base64="Yg=="))


def test_fingerprint_excludes_session_and_idempotency_key() -> None:
    base = fp(http(body="b"))
    assert fp(http(body="b", session="other")) == base
    # the key is the lookup for the fingerprint, not part of it: reusing it with another body
    # must be detectable as a mismatch (seed: IDEMPOTENCY_MISMATCH)
    assert fp(http(body="b", idempotency_key="k1")) == base


@pytest.mark.parametrize(
    "change",
    [
        {"body": "c"},
        {"body": None, "body_base64": "Yw=="},
        {"path": "/v1/charges/"},
        {"path": "/v1/charges?x=1"},
        {"method": "PUT"},
        {"headers": {"X-A": "1"}},
        {"headers": {"X-A": "2", "X-B": "2"}},
    ],
)
def test_fingerprint_changes_with_the_request(change: dict[str, Any]) -> None:
    assert fp(http(**{"body": "b", "headers": {"X-A": "2"}, **change})) != fp(
        http(body="b", headers={"X-A": "2"})
    )


@pytest.mark.parametrize(
    "action",
    [
        http(),
        http(body=""),
        http(body="b"),
        http(method="GET", body=None),
        http(body_base64="AA=="),
    ],
)
def test_the_body_hash_is_the_sha256_of_the_body_also_without_one(action: dict[str, Any]) -> None:
    """Issue 15: a request without a body (a GET) takes the empty body's hash made once, not a
    hash per call: the identity the fingerprint covers is the same bytes either way."""
    from affidavit.protocols.http.action import identity

    parsed = parse_action(action, CONFIG)
    target = CONFIG.targets[parsed.target]
    assert isinstance(parsed, HttpAction) and isinstance(target, HttpTarget)
    ident = identity(parsed, target)
    assert ident["body_sha256"] == hashlib.sha256(parsed.body).hexdigest()
    assert list(ident) == ["method", "path", "headers", "body_sha256"]


def test_fingerprint_changes_with_the_target_snapshot() -> None:
    action = parse_action(http(body="b"), CONFIG)
    target = CONFIG.targets["billing"]
    assert isinstance(target, HttpTarget)
    for change in (
        {"url": "https://billing.example.com/api2", "base_path": "/api2"},
        {"origin": "https://evil.example:443"},
        {"credential": "env:OTHER"},
        {"inject": "bearer"},
        {"follow_redirects": True},
    ):
        other = dataclasses.replace(target, **change)  # type: ignore[arg-type]
        assert snapshot_hash(other) != snapshot_hash(target)
        assert fingerprint(action, other, snapshot_hash(other)) != fingerprint(
            action, target, snapshot_hash(target)
        )


def test_ssh_fingerprint() -> None:
    base = fp(ssh(stdin="x"))
    assert fp(ssh(stdin="x", session="s")) == base
    assert fp(ssh(stdin="y")) != base
    assert fp(ssh()) != fp(ssh(stdin=""))  # no stdin is not an empty stdin
    assert fp(ssh(command="deploy --release r2", stdin="x")) != base
    target = CONFIG.targets["deploy"]
    assert isinstance(target, SshTarget)
    other = dataclasses.replace(target, host="10.0.0.9")
    assert fingerprint(parse_action(ssh(stdin="x"), CONFIG), other, snapshot_hash(other)) != base


def test_fingerprint_refuses_a_mismatched_target_kind() -> None:
    with pytest.raises(TypeError):
        fingerprint(parse_action(ssh(), CONFIG), CONFIG.targets["billing"], "h")
    with pytest.raises(TypeError):
        fingerprint(parse_action(http(), CONFIG), CONFIG.targets["deploy"], "h")


# --- idempotency by configuration -------------------------------------------------------------


def test_is_idempotent_reads_configuration_not_method_names() -> None:
    billing = CONFIG.targets["billing"]
    search = CONFIG.targets["search"]
    deploy = CONFIG.targets["deploy"]
    assert is_idempotent(parse_action(http(method="GET"), CONFIG), billing)
    assert is_idempotent(parse_action(http(method="PUT"), CONFIG), billing)
    assert not is_idempotent(parse_action(http(method="POST"), CONFIG), billing)
    # `search` lists no idempotent methods: its GET is not assumed safe
    get = parse_action({"target": "search", "method": "GET", "path": "/"}, CONFIG)
    assert not is_idempotent(get, search)
    assert is_idempotent(parse_action(ssh(command="systemctl is-active app"), CONFIG), deploy)
    # exact match only: a different spelling of the "same" command is not the configured one
    assert not is_idempotent(parse_action(ssh(command="systemctl  is-active app"), CONFIG), deploy)
    assert not is_idempotent(parse_action(ssh(), CONFIG), deploy)
    assert not is_idempotent(parse_action(ssh(), CONFIG), billing)


@pytest.mark.parametrize("stdin", ["rm -rf", ""])
def test_a_listed_command_with_stdin_is_not_idempotent(stdin: str) -> None:
    # The listing vouches for the command line, not for the code its stdin feeds it (`sh`,
    # `psql`): an unknown outcome would be sent again without a look.  No stdin is not an empty
    # stdin; an empty one counts too, as it does for approval.
    deploy = CONFIG.targets["deploy"]
    action = parse_action(ssh(command="systemctl is-active app", stdin=stdin), CONFIG)
    assert not is_idempotent(action, deploy)


# --- the caller cannot shadow the credential (issue 9) ----------------------------------------
# Servers do not read header and parameter names byte for byte: header names are
# case-insensitive (RFC 9110 §5.1) and CGI, WSGI and nginx map "_" and "-" to the same
# HTTP_X_API_KEY; PHP reads "a.b" and "a b" as "a_b".  A spelling any of them reads as the
# injected name would let the caller's value stand in for (or beside) the credential.

SEARCH = {"target": "search", "method": "GET"}


@pytest.mark.parametrize(
    "name",
    ["X_Api_Key", "x-api-key", "X-API-KEY", "X-Api-Key ", " x_API-key", "x_api_key"],
)
def test_a_header_a_server_reads_as_the_injected_one_is_forbidden(name: str) -> None:
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(headers={name: "mine"}), CONFIG)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, f"headers.{name}")


@pytest.mark.parametrize(
    "name", ["Idempotency_Key", "AUTHORIZATION", "Proxy_Authorization", "Content_Length", "Host "]
)
def test_every_broker_owned_header_is_matched_the_same_way(name: str) -> None:
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(headers={name: "x"}), CONFIG)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, f"headers.{name}")


def test_two_spellings_of_one_header_are_refused_as_a_duplicate() -> None:
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(headers={"X-Trace": "a", "x_trace": "b"}), CONFIG)
    assert (info.value.code, info.value.field) == (Code.INVALID_FIELD, "headers.x_trace")


def test_an_unprintable_forbidden_name_is_not_echoed_in_the_field_path() -> None:
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(headers={"X-Api-Key\t": "x"}), CONFIG)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "headers")


@pytest.mark.parametrize(
    "path",
    [
        "/q?API_KEY=mine",
        "/q?Api-Key=mine",
        "/q?api.key=mine",
        "/q?api+key=mine",
        "/q?api%20key=mine",
        "/q?x=1;api_key=mine",
        "/q?api%5Bkey=mine",
        "/q?a=1&%41PI_KEY=mine",
        # PHP, Rack and qs (Express) decode these to api_key[] and read the parameter api_key,
        # an array or a map: qs then holds the caller's value beside the credential,
        # ["mine", "<credential>"].  (Raw brackets are refused in a path anyway.)
        "/q?api_key%5B%5D=mine",
        "/q?api_key%5B0%5D=mine",
        "/q?API-KEY%5Bx%5D=mine",
        "/q?api_key%5b%5d=mine",
        "/q?%5Bapi_key%5D=mine",  # Rack 2: [api_key] is api_key
    ],
)
def test_a_query_parameter_a_server_reads_as_the_injected_one_is_forbidden(path: str) -> None:
    with pytest.raises(ActionInvalid) as info:
        parse_action({**SEARCH, "path": path}, CONFIG)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "path")


@pytest.mark.parametrize(
    "path",
    [
        "/q?api_keys=1",
        "/q?my_api_key=1",
        "/q?apikey=1",
        "/q?api_keys%5B%5D=1",
        "/q?x%5Bapi_key%5D=1",  # a map x with the key api_key: no parameter api_key
    ],
)
def test_other_query_parameters_stay_allowed(path: str) -> None:
    assert parse_action({**SEARCH, "path": path}, CONFIG).path == path


@pytest.mark.parametrize(
    "name",
    [
        "X-HTTP-Method-Override",
        "x_http_method",
        "X-Method-Override",
        "X-Original-URL",
        "x-rewrite-url",
    ],
)
def test_a_header_that_overrides_the_method_or_path_is_forbidden(name: str) -> None:
    """ASP.NET, Express's method-override, Google's APIs and Symfony read the method from
    these headers, IIS and Symfony the path: a GET the target allows (and retries as
    idempotent) would run as DELETE, a path in the base path would reach /admin -- with the
    credential."""
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(headers={name: "DELETE"}), CONFIG)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, f"headers.{name}")


@pytest.mark.parametrize(
    "path",
    [
        "/q?_method=DELETE",
        "/q?a=1&_METHOD=DELETE",
        "/q?%5Fmethod=DELETE",
        "/q?%5fMethod=DELETE",
        "/q?%255Fmethod=DELETE",
        "/q?x=1;_method=DELETE",
        "/q?_method%5B%5D=DELETE",
        "/q?%5B_method%5D=DELETE",  # Rack 2 reads [_method] and ]_method as _method
        "/q?%5D_method=DELETE",
        "/q?_HttpMethod=PATCH",
        "/q?X-HTTP-Method-Override=DELETE",
        "/q?x_http_method=DELETE",
        "/q?x.method.override=DELETE",
        "/q?X-Original-URL=/admin",
        "/q?x-rewrite-url=/admin",
    ],
)
def test_a_query_parameter_that_overrides_the_method_or_path_is_forbidden(path: str) -> None:
    """Rails, Laravel/Symfony and Express's method-override read ``_method`` from the query of a
    POST, some stacks the override headers' names too: an allowed POST would run as DELETE.
    Refused as the override headers are: ``FORBIDDEN_HEADER`` at ``path``."""
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(method="POST", path=path), CONFIG)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "path")


@pytest.mark.parametrize(
    "path",
    ["/q?_method%00=DELETE", "/q?a%0Ab=1", "/q?%7F=1", "/q?a%C2%85=1", "/q?x=1&%2500=1"],
)
def test_a_query_parameter_name_with_a_control_character_is_invalid(path: str) -> None:
    with pytest.raises(ActionInvalid) as info:
        parse_action(http(method="POST", path=path), CONFIG)
    assert (info.value.code, info.value.field) == (Code.INVALID_FIELD, "path")


@pytest.mark.parametrize(
    "path", ["/q?method=DELETE", "/q?my_method=1", "/q?_methods=1", "/q?q=a%0Ab", "/q?_x=1"]
)
def test_query_parameters_that_override_nothing_stay_allowed(path: str) -> None:
    assert parse_action(http(method="POST", path=path), CONFIG).path == path


FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data; boundary=XyZ"
FORMS = config_from_dict(
    {
        "targets": {
            "forms": {
                "kind": "http",
                "url": "https://app.example.com",
                "methods": ["POST"],
                "credential": "env:APP_TOKEN",
            }
        }
    },
    base_dir=Path("/tmp"),
)


def form(**over: Any) -> dict[str, Any]:
    return {"target": "forms", "method": "POST", "path": "/posts/1", **over}


def _part(disposition: str) -> str:
    return f"--XyZ\r\nContent-Disposition: {disposition}\r\n\r\nDELETE\r\n--XyZ--\r\n"


@pytest.mark.parametrize(
    ("content_type", "body", "code"),
    [
        (FORM, "_method=DELETE", Code.FORBIDDEN_HEADER),
        (FORM, "a=1&%5FMETHOD=delete", Code.FORBIDDEN_HEADER),
        (FORM, "%5B_method%5D=DELETE", Code.FORBIDDEN_HEADER),
        (f"{FORM}; charset=utf-8", "x-http-method-override=DELETE", Code.FORBIDDEN_HEADER),
        (None, "a=1&_method=DELETE", Code.FORBIDDEN_HEADER),  # Rack parses an untyped POST
        (MULTIPART, _part('form-data; name="_method"'), Code.FORBIDDEN_HEADER),
        (MULTIPART, _part("form-data; name=_Method"), Code.FORBIDDEN_HEADER),
        # Rack 2 and 3 take a part's last name, Rack 3 undoes backslash escapes in a quoted
        # one and reads a folded header, Rack 1 any "\s+name=", Rack a part's Content-ID as
        # its name when it has no Content-Disposition, busboy RFC 2231's name*.
        (MULTIPART, _part('form-data; name="title"; name="_method"'), Code.FORBIDDEN_HEADER),
        (MULTIPART, _part('form-data; name="\\_method"'), Code.FORBIDDEN_HEADER),
        (MULTIPART, _part('form-data;\r\n name="_method"'), Code.FORBIDDEN_HEADER),
        (MULTIPART, _part('form-data; filename="a" x name=_method'), Code.FORBIDDEN_HEADER),
        (
            MULTIPART,
            "--XyZ\r\nContent-ID: _method\r\n\r\nDELETE\r\n--XyZ--\r\n",
            Code.FORBIDDEN_HEADER,
        ),
        (MULTIPART, _part("form-data; name*=utf-8''%5Fmethod"), Code.FORBIDDEN_HEADER),
        (FORM, "_method%00=DELETE", Code.INVALID_FIELD),
        (FORM, "a%0Ab=1", Code.INVALID_FIELD),
        # Rack's media type ends at "," too, and an empty Content-Type is none to Rack.
        (f"{FORM},text/plain", "_method=DELETE", Code.FORBIDDEN_HEADER),
        ("", "_method=DELETE", Code.FORBIDDEN_HEADER),
        # Laravel's request bag is the JSON object of a JSON body: _method there is read too.
        ("application/json", '{"_method": "DELETE"}', Code.FORBIDDEN_HEADER),
        (
            "application/vnd.api+json; charset=utf-8",
            '{"a": 1, "\\u005fmethod": "DELETE"}',
            Code.FORBIDDEN_HEADER,
        ),
        ("application/json", '{"X-HTTP-Method-Override": "DELETE"}', Code.FORBIDDEN_HEADER),
        # Laravel's isJson: "/json" anywhere in the header, not only in the media type.
        ("text/plain, application/json", '{"_method": "DELETE"}', Code.FORBIDDEN_HEADER),
        (f"{FORM}; x=/json", '{"_method": "DELETE"}', Code.FORBIDDEN_HEADER),
    ],
)
def test_a_form_body_that_overrides_the_method_is_refused_at_its_field(
    content_type: str | None, body: str, code: Code
) -> None:
    """Rails' Rack::MethodOverride reads ``_method`` from a POST's form body (a body without a
    Content-Type included), Laravel/Symfony and Express's method-override too."""
    headers = {"Content-Type": content_type} if content_type is not None else None
    with pytest.raises(ActionInvalid) as info:
        parse_action(form(body=body, headers=headers), FORMS)
    assert (info.value.code, info.value.field) == (code, "body")
    b64 = base64.b64encode(body.encode()).decode()
    with pytest.raises(ActionInvalid) as info:
        parse_action(form(body_base64=b64, headers=headers), FORMS)
    assert (info.value.code, info.value.field) == (code, "body_base64")


@pytest.mark.parametrize(
    "headers",
    [
        b'Content-Disposition: form-data; name="a"\r\n' * 25_000,
        b"Content-Disposition: form-data" + b'; name="a\\\\\\"x' * 70_000,
        b"Content-Disposition: " + b" name=a" * 140_000,
        b"Content-ID:" + b" " * 1_000_000,
    ],
)
def test_a_hostile_multipart_body_is_checked_in_bounded_time(headers: bytes) -> None:
    """About 1 MiB of part headers, each crafted so that a scan reading every "name=" to the
    end of its header is quadratic (24 s of CPU for the third once, over 300 s for others):
    the scan reads a bounded span per name (``_NAME_VALUE``), ~0.2 s here.  A guard against
    the quadratic scan coming back, not a speed target: its bound is CPU time of this process
    (other load does not count) with a wide margin."""
    target = dataclasses.replace(FORMS.targets["forms"], max_body=2 << 20)  # type: ignore[type-var]
    config = dataclasses.replace(FORMS, targets={"forms": target})
    b64 = base64.b64encode(headers).decode()
    started = time.process_time()
    with contextlib.suppress(ActionInvalid):  # a control character refused: also bounded
        parse_action(form(body_base64=b64, headers={"Content-Type": MULTIPART}), config)
    assert time.process_time() - started < 15.0


def test_a_json_body_typed_through_an_underscore_header_name_is_read_as_json() -> None:
    """``Content_Type`` is the type to stacks that map ``_`` to ``-`` (PHP's $_SERVER, WSGI):
    the JSON object's ``_method`` is refused as with ``Content-Type``."""
    action = form(body='{"_method": "DELETE"}', headers={"Content_Type": "application/json"})
    with pytest.raises(ActionInvalid) as info:
        parse_action(action, FORMS)
    assert (info.value.code, info.value.field) == (Code.FORBIDDEN_HEADER, "body")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", '{"method": "DELETE", "data": {"_method": "x"}}'),
        ("application/json", '[{"_method": "DELETE"}]'),
        ("application/json", "not json, method"),
        (FORM, "method=DELETE&my_method=1"),
        (FORM, "caf%C3%A9=1&%E2%82%AC=2"),
        (None, "\x00\x01 raw bytes = & ;"),
        (MULTIPART, _part('form-data; name="file"; filename="_method"')),
        (MULTIPART, _part('form-data; name="a"\r\nContent-ID: <part1@example.com>')),
    ],
)
def test_bodies_that_override_nothing_stay_allowed(content_type: str | None, body: str) -> None:
    headers = {"Content-Type": content_type} if content_type else None
    assert parse_action(form(body=body, headers=headers), FORMS).body == body.encode()
