"""A call the daemon refused for its uid's ``[service] call_rate`` (429 ``RATE_LIMITED``,
nothing journaled, nothing sent), answered through the MCP proxy: ``not_attempted`` and
``backoff`` with the daemon's ``retry_after`` -- never ``unknown`` / ``reconcile``, which would
tell the agent that the action may have run."""

from __future__ import annotations

from affidavit.api.wire import ApiError
from affidavit.mcp.backends import _client_failure


def test_a_rate_limited_call_is_not_attempted_and_backs_off() -> None:
    refused = ApiError(429, "RATE_LIMITED", "this uid started calls faster ...", retry_after=7)
    answer = _client_failure(refused, ("", "reconcile"))  # a call's: it might have been sent
    assert answer == {
        "api_error": {
            "code": "RATE_LIMITED",
            "message": "this uid started calls faster ...",
            "outcome": "not_attempted",
            "retry": "backoff",
            "retry_after": 7,
        }
    }
