"""Views over the journal as plain data, shared by every interface."""

from affidavit.views.records import (
    Newest,
    actions_page,
    event_to_json,
    metrics,
    metrics_key,
    metrics_of,
    newest_sessions,
    plain,
    prometheus_text,
    record_json_encoder,
    record_to_json,
    record_view,
    shown_code,
    shown_error,
)
from affidavit.views.text import printable

__all__ = [
    "Newest",
    "actions_page",
    "event_to_json",
    "metrics",
    "metrics_key",
    "metrics_of",
    "newest_sessions",
    "plain",
    "printable",
    "prometheus_text",
    "record_json_encoder",
    "record_to_json",
    "record_view",
    "shown_code",
    "shown_error",
]
