"""``unplaced`` takes out every name a journal's libpq URL gives its server, however the URL
gives it: a host in upper case, several hosts (``a,b`` in the authority or ``?host=a,b``), a
``?host=`` / ``?hostaddr=`` parameter, a unix socket's directory, a bracketed IPv6 address,
the database and user as parameters -- wherever the driver's words quote it, in any case.  A
bare word is left: an id the caller sent may equal it, and taking it out would confirm it."""

from __future__ import annotations

import pytest

from affidavit.engine.location import unplaced

CODE = "JOURNAL_UNREADABLE"


def _out(url: str, *quoted: str) -> str:
    said = "; ".join(f'could not translate host name "{name}" to address' for name in quoted)
    return unplaced(CODE, said, url)


@pytest.mark.parametrize(
    ("url", "quoted"),
    [
        ("postgresql://broker@DB.Example.COM/affidavit", ("DB.Example.COM", "db.example.com")),
        ("postgresql://u@db-a.in:5432,DB-B.in:5433/x", ("db-a.in", "db-b.in")),
        ("postgresql:///affidavit?host=first.in,Second.in", ("first.in", "second.in")),
        ("postgresql://broker@/affidavit?hostaddr=10.9.8.7,10.9.8.6", ("10.9.8.7", "10.9.8.6")),
        ("postgresql://u@x.in/affidavit?host=y.in&host=z.in", ("x.in", "y.in", "z.in")),
        ("postgresql://broker@%2Fvar%2Frun%2Fcanary-pg/affidavit", ("/var/run/canary-pg",)),
        ("postgresql:///affidavit?host=/run/Canary-PG", ("/run/canary-pg",)),
        ("postgres://broker@[fd00::7]:5432/affidavit", ("fd00::7",)),
        ("postgresql://h.in/x?user=Canary-Role&dbname=Canary-DB", ("canary-role", "Canary-DB")),
    ],
)  # fmt: skip
def test_every_form_of_a_host_or_name_is_taken_out(url: str, quoted: tuple[str, ...]) -> None:
    out = _out(url, *quoted)
    for name in quoted:
        assert name.lower() not in out.lower(), out
    assert out.count("(the journal's)") == len(quoted), out


def test_single_quotes_and_the_driver_preamble_go_too() -> None:
    url = "postgresql://broker@A.internal,b.internal/affidavit"
    said = "connection to server at \"b.internal\" (10.0.0.5), port 5432 failed: host 'A.INTERNAL'"
    out = unplaced(CODE, said, url)
    assert out == "connection to the journal's server failed: host (the journal's)", out


def test_a_bare_word_and_another_answer_are_left_alone() -> None:
    url = "postgresql://broker@localhost/affidavit"
    said = "no record of localhost"  # an id the caller sent, as the words quote it
    assert unplaced(CODE, said, url, ("localhost",)) == said
    assert unplaced(CODE, said, url, ("localhostx",)) == said
    quoted = 'host "localhost"'
    assert unplaced("NO_SUCH_INVOCATION", quoted, url) == quoted  # not the journal's words
