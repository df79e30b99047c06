"""What the broker keeps from its callers: credential references and their resolution, HTTP
injection (``credentials``), output redaction in every form docs/redaction.md lists
(``redaction``) and the encrypted vault file (``vault``)."""
