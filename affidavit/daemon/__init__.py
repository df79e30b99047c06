"""``affidavit serve``: the broker as its own process behind a Unix socket.

The daemon owns the journal (its only writer), the vault and the credentials; callers hold
only the socket.  ``server`` runs it (peer check, start-up recovery, shutdown grace),
``socketfile`` claims the socket's path and makes the socket, ``app`` answers the API, ``calls``
owns the calls in flight, ``link`` decides what counts as delivered, ``peer`` reads the kernel's
word on who connected.  Clients live in ``affidavit.api`` (``Client``) and ``affidavit.cli``
(``--socket``)."""

from .peer import Peer, PeerPolicy, peer_of
from .server import Daemon, DaemonError, serve

__all__ = ["Daemon", "DaemonError", "Peer", "PeerPolicy", "peer_of", "serve"]
