"""The test PostgreSQL server (``tests/postgres.py``) signs its superuser in as a deployment's
would -- SCRAM-SHA-256 over TCP, a wrong password refused -- with the verifier stored at one
PBKDF2 iteration, so a connection (the conformance suite opens thousands) costs little; and
starts on another port when another process took the one it was given."""

from __future__ import annotations

import psycopg
import pytest

from tests.external import POSTGRES
from tests.postgres import Cluster, running_cluster


def test_the_superuser_signs_in_by_scram_of_one_iteration_and_a_wrong_password_is_refused(
    pg: Cluster,
) -> None:
    ((verifier,),) = pg.sql("SELECT rolpassword FROM pg_authid WHERE rolname = current_user")
    assert verifier.startswith("SCRAM-SHA-256$1:"), verifier.split(":", 1)[0]
    rules = pg.sql("SELECT DISTINCT auth_method FROM pg_hba_file_rules WHERE type = 'host'")
    assert rules == [("scram-sha-256",)]
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        assert conn.execute("SELECT inet_client_addr() IS NOT NULL").fetchone() == (True,)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(pg.url(password="wrong-" + pg.password)).close()


def test_a_port_another_process_took_first_is_left_and_the_server_starts_on_another(
    taken_port: int,
) -> None:
    POSTGRES.require()
    with running_cluster() as cluster:
        assert cluster.port != taken_port
        assert "Address already in use" in cluster.log_text()  # the first start's
        assert cluster.sql("SELECT current_setting('port')::int") == [(cluster.port,)]
