"""A broker process's stop: its signals taken by a thread of its own (``signals``), and its
length bounded whatever the journal does (``bound``) -- for ``affidavit serve`` and ``affidavit
mcp`` run embedded, the processes that open a journal themselves.  A leaf: imports only
``affidavit.text``."""
