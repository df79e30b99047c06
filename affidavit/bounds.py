"""The longest a call may legitimately take in the daemon, where the schema bounds it and the
thin clients wait for it: one number each, in a leaf both import (the thin client does not
import the schema, and the schema nothing of the API)."""

__all__ = ["MAX_RECONNECT", "MAX_TOTAL", "MAX_TTL"]

MAX_TOTAL = 86400.0
"""The longest ``timeout`` (``connect``, ``total``) a target may be given: a day
(``schema.target``)."""

MAX_TTL = 7 * 86400.0
"""The longest an approval may be valid, and so a caller wait for the decision
(``approval.wait`` is at most its ``ttl``): a week (``schema.approval``).  An approval is a
decision about one request now; a week is already generous."""

MAX_RECONNECT = 3600.0
"""The longest ``[journal] reconnect`` a broker may be given: an hour (``config.loader``).  A
journal read waits for a lost database at most that long, so a client bounds a read's wait
for its first byte by it (``wire.read_wait``); the recommended value is 10 s."""
