"""What the broker keeps from its callers: credential references and their resolution, HTTP
injection, output redaction (``credentials``) and the encrypted vault file (``vault``)."""
