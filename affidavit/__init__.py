"""Affidavit: a secrets broker whose every error is backed by durable evidence."""

__version__ = "0.1.0"
