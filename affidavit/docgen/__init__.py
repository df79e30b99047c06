"""The contract and diagram generator: ``diagrams/``, ``docs/contract.md`` and
``docs/envelope.schema.json`` derived from the tables (``affidavit diagrams [--check]``)."""
