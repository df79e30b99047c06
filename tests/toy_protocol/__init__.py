"""A test-only protocol, added the way any protocol is: everything it needs lives in this folder
and the service finds it through ``PROTOCOL`` (an ``affidavit.protocols`` entry point in a
test-made ``.dist-info``, or ``affidavit.protocols.register``).  See docs/adding-a-protocol.md."""

from .protocol import PROTOCOL, TOY_TABLE, ToyAction, ToyTarget

__all__ = ["PROTOCOL", "TOY_TABLE", "ToyAction", "ToyTarget"]
