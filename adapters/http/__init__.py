"""HTTP adapter: a sans-IO protocol machine over h11 (``machine``), pure classification of
complete responses (``classify``) and the trio driver (``client``, with ``pool``, ``connect``,
``exchange``, ``redirects``, ``urls`` and ``request``).

Importing the package registers ``HTTP_TABLE`` with ``affidavit.statemachine.protocol``."""

from .classify import (
    Classification,
    Redactor,
    classify_response,
    parse_proxy_status,
    parse_retry_after,
)
from .client import HttpClient
from .machine import HTTP_TABLE, FramingError, HttpExchange, Observation
from .request import HttpRequest, RedirectDecision, Timeouts

__all__ = [
    "HTTP_TABLE",
    "Classification",
    "FramingError",
    "HttpClient",
    "HttpExchange",
    "HttpRequest",
    "Observation",
    "Redactor",
    "RedirectDecision",
    "Timeouts",
    "classify_response",
    "parse_proxy_status",
    "parse_retry_after",
]
