"""A real PostgreSQL for tests and benchmarks: Debian's server (``tests/external.POSTGRES``),
``initdb`` into a temporary directory and ``postgres`` on a loopback port, run as an
unprivileged user when we are root (PostgreSQL refuses to run as root; CI runs as root).

One ``Cluster`` per test session (``tests/conftest.py``'s ``pg`` fixture); each test takes a
fresh database of it (``Cluster.database``).  A server never outlives the process that started
it, however that process ends (``tests/pgowner.py``: a watchdog, and at each start the servers
of owners gone are stopped).  The superuser's password is a canary: tests check
it never reaches a message, a log line or a record.  ``restart``/``stop``/``start`` run
``pg_ctl`` for the failure tests; ``terminate`` ends one session from another connection
(``pg_terminate_backend``), which is how a lost connection is simulated deterministically.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import itertools
import os
import pwd
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tests import pgowner
from tests.external import IN_USE, POSTGRES, PortTaken, on_free_port

__all__ = ["Cluster", "Proxy", "lost_runs", "running_cluster", "terminate_on_insert"]

_USER = "nobody"
PORT_CONF = "port.conf"
"""In the data directory, included by postgresql.conf: the port, written at each first start."""
_counter = itertools.count(1)


def _demote() -> dict[str, Any]:
    """Popen arguments that run a child as ``nobody`` when we are root (else as ourselves)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class Cluster:
    """A running PostgreSQL server owned by this process."""

    def __init__(
        self,
        bindir: Path,
        root: Path,
        port: int,
        password: str,
        watchdog: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.port = port
        self.password = password
        self.user = "affidavit"
        self.log = root / "postgres.log"
        self.watchdog = watchdog
        """``pgowner.claim``'s: it stops the server and removes ``root`` if we go first."""

    # -- life ---------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        *,
        fsync: bool = True,
        full_page_writes: bool = True,
        tmpfs: bool = True,
        where: Path | None = None,
    ) -> Cluster:
        """``initdb`` and start a new cluster.  Durable settings (a broker refuses a server
        without them: ``JournalNotDurable``); for tests its data lives in ``/dev/shm`` where
        there is one, so an fsync costs nothing (no power loss is simulated); benchmarks pass
        ``tmpfs=False`` for a real disk.  First the servers there whose owner is gone are
        stopped (``pgowner.reap_stale``); this one is owned by this process.  ``where``: another
        parent directory (tests/test_pg_owner.py's, which no other session's start sweeps)."""
        postgres = Path(POSTGRES.require())
        if where is None:
            shm = Path("/dev/shm")
            usable = tmpfs and shm.is_dir() and os.access(shm, os.W_OK)
            where = shm if usable else Path(tempfile.gettempdir())
        pgowner.reap_stale(where)
        root = Path(tempfile.mkdtemp(prefix=pgowner.PREFIX, dir=where))
        root.chmod(0o700)
        password = "pg-canary-" + secrets.token_hex(8)
        cluster = cls(postgres.parent, root, 0, password, pgowner.claim(root))
        try:
            demote = _demote()
            if demote:
                os.chown(root, demote["user"], demote["group"])
            pwfile = root / "pw"
            pwfile.write_text(password + "\n")
            if demote:
                os.chown(pwfile, demote["user"], demote["group"])
            cluster._run(
                "initdb",
                "-D", str(cluster.data), "-U", cluster.user, f"--pwfile={pwfile}",
                "--auth-host=scram-sha-256", "--auth-local=trust", "-E", "UTF8", "--no-sync",
                "--locale=C",
            )  # fmt: skip
            pwfile.unlink()
            conf = cluster.data / "postgresql.conf"
            with conf.open("a") as f:
                f.write(
                    f"listen_addresses = '127.0.0.1'\ninclude '{PORT_CONF}'\n"
                    f"unix_socket_directories = '{root}'\nfsync = {'on' if fsync else 'off'}\n"
                    f"full_page_writes = {'on' if full_page_writes else 'off'}\n"
                    "max_connections = 200\nshared_buffers = 64MB\n"
                )
            on_free_port(cluster._start_on)
            cluster._stretch_once()
        except BaseException:
            cluster.destroy()  # and release its watchdog
            raise
        return cluster

    def _start_on(self, port: int) -> None:
        """The first start, on ``port``: ``PortTaken`` when another process held it (the
        server's log says so), and ``tests.external.on_free_port`` picks another."""
        conf = self.data / PORT_CONF
        conf.write_text(f"port = {port}\n")
        conf.chmod(0o644)  # the server may run as another user (``nobody`` under root)
        self.port = port
        before = len(self.log.read_bytes()) if self.log.exists() else 0
        try:
            self.start()
        except subprocess.CalledProcessError as exc:
            said = self.log.read_bytes()[before:].decode(errors="replace")
            if IN_USE in said:
                raise PortTaken(f"port {port}: {said}") from None
            # What the server said, in the failure's report: a start that fails under a loaded
            # suite (seen three times in stop 51, never alone) is otherwise only "exit status 1".
            exc.add_note(f"pg_ctl: {exc.stderr.strip()[-1000:]}\npostgres.log: {said[-2000:]}")
            raise

    def _stretch_once(self) -> None:
        """Store the superuser's password as a SCRAM-SHA-256 verifier of one PBKDF2 iteration
        (PostgreSQL takes a verifier as it is; 4096 otherwise).  Every connection still runs
        the whole SCRAM exchange on the same password, and a wrong one is still refused; only
        the key stretching -- against an offline guess at a stolen verifier, which a test
        server has no use for -- is gone.  It was most of a connection's cost: ~7 of ~8 ms of
        CPU, and the conformance suite opens thousands (a new reader each)."""
        salt = secrets.token_bytes(16)
        salted = hashlib.pbkdf2_hmac("sha256", self.password.encode(), salt, 1)
        client = hmac.digest(salted, b"Client Key", "sha256")
        server = hmac.digest(salted, b"Server Key", "sha256")
        b64 = [base64.b64encode(x).decode() for x in (salt, hashlib.sha256(client).digest())]
        verifier = f"SCRAM-SHA-256$1:{b64[0]}${b64[1]}:{base64.b64encode(server).decode()}"
        self.sql(f"ALTER ROLE {self.user} PASSWORD '{verifier}'")

    def _run(
        self, program: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bindir / program), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=check,
            cwd=self.root,
            **_demote(),
        )

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w", "-t", "60",
            "restart",
        )  # fmt: skip

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", check=False)
        # A server pg_ctl could not stop is killed (pgowner.reap), never left running with its
        # directory gone: no later sweep would find it then.
        pgowner.reap(self.root)
        if self.watchdog is not None:
            pgowner.release(self.watchdog)
            self.watchdog = None

    def postmaster(self) -> int | None:
        """The running server's pid (``pgowner.postmaster``), None when it is not running."""
        return pgowner.postmaster(self.data)

    # -- databases and sessions ------------------------------------------------------------------

    def url(
        self, database: str = "postgres", *, user: str | None = None, password: str | None = None
    ) -> str:
        who = user or self.user
        secret = self.password if password is None else password
        return f"postgresql://{who}:{secret}@127.0.0.1:{self.port}/{database}"

    def sql(
        self, statement: str, database: str = "postgres", params: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """Run one statement as the superuser; its rows (if any)."""
        import psycopg

        with psycopg.connect(self.url(database), autocommit=True) as conn:
            cur = conn.execute(statement, params)  # type: ignore[arg-type]
            return list(cur.fetchall()) if cur.description else []

    def database(self) -> str:
        """A new, empty database; its URL."""
        name = f"t{os.getpid()}_{next(_counter)}"
        self.sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def terminate(self, pid: int, database: str) -> bool:
        """End one session (``pg_terminate_backend``) from another connection."""
        rows = self.sql("SELECT pg_terminate_backend(%s)", database, (pid,))
        return bool(rows and rows[0][0])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def running_cluster(
    *, fsync: bool = True, full_page_writes: bool = True, where: Path | None = None
) -> Iterator[Cluster]:
    cluster = Cluster.create(fsync=fsync, full_page_writes=full_page_writes, where=where)
    try:
        yield cluster
    finally:
        cluster.destroy()


class Proxy:
    """A TCP proxy on loopback between journal clients and PostgreSQL, which a test cuts: the
    network failing under a broker, deterministically.

    * ``cut()``: every connection through it is closed at once and new ones are refused
      (``restore()`` lets them through again);
    * ``lose_next_answer(then_cut=...)``: the next bytes a client sends are delivered to the
      server, and the server's answer to them is dropped with the connection -- a COMMIT that
      landed while its client never heard so;
    * ``hold_next_request()``: the next bytes a client sends are held back and its side of the
      connection is closed, while the server's side stays open -- a COMMIT still on its way
      when its client gave up -- until ``release()`` delivers them (the server's answer is
      then dropped with the connection);
    * ``freeze()``: every byte either way is read and dropped, every connection left open -- a
      server that takes the packets and never answers (a stopped one: its kernel acknowledges
      them), which no keepalive notices (``thaw()`` lets bytes through again).

    Threads pump each direction; every loop ends when its sockets close (``close()`` closes all).
    """

    def __init__(self, target_port: int) -> None:
        import socket
        import threading

        self._socket = socket
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.port = int(self.listener.getsockname()[1])
        self.refusing = False
        self._armed = False
        self._cut_after_loss = False
        self.lost_answers = 0
        self._hold = False
        self.frozen = False
        self.swallowed = 0
        """Client packets taken while frozen (a query that will wait for ever)."""
        self._held: tuple[Any, bytes] | None = None
        self._pairs: list[tuple[Any, Any]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def url(self, cluster: Cluster, database_url: str) -> str:
        """``database_url`` (a ``cluster.database()``) reached through this proxy."""
        return database_url.replace(f":{cluster.port}/", f":{self.port}/")

    def _accept(self) -> None:
        import threading

        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = self._socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._pairs.append((client, server))
            pair = {"awaiting": False}
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(
                    target=self._pump, args=(src, dst, up, pair, client, server), daemon=True
                ).start()

    def _pump(self, src: Any, dst: Any, up: bool, pair: dict[str, bool], *both: Any) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if self.frozen:
                if up:
                    self.swallowed += 1
                continue  # taken, never answered
            if not up and pair["awaiting"]:
                # The server's answer to the armed request: dropped with the connection.
                self.lost_answers += 1
                if self._cut_after_loss:
                    self.refusing = True
                break
            if up and self._hold:
                # Held: the client hears its connection is gone, the server hears nothing.
                # What the client sends right after (the rest of its commit: a pipeline's
                # Sync) is held with it.
                self._hold = False
                with contextlib.suppress(OSError):
                    src.settimeout(0.3)
                    while more := src.recv(65536):
                        data += more
                self._held = (dst, data)
                _shut(src)
                return
            if up and self._armed:
                # Before the bytes go: the answer may come back before sendall returns.
                self._armed = False
                pair["awaiting"] = True
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in both:
            _shut(s)

    def lose_next_answer(self, *, then_cut: bool = False) -> None:
        self._cut_after_loss = then_cut
        self._armed = True

    def hold_next_request(self) -> None:
        self._hold = True

    @property
    def holding(self) -> bool:
        return self._held is not None

    def release(self) -> None:
        """Deliver the held bytes to the server (its answer goes nowhere)."""
        held, self._held = self._held, None
        assert held is not None, "nothing held"
        with contextlib.suppress(OSError):
            held[0].sendall(held[1])

    def cut(self) -> None:
        self.refusing = True
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for s in pair:
                _shut(s)

    def restore(self) -> None:
        self.refusing = False

    def freeze(self) -> None:
        self.frozen = True

    def thaw(self) -> None:
        self.frozen = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        with contextlib.suppress(OSError):
            self.listener.close()
        self._thread.join(timeout=5)


def _shut(sock: Any) -> None:
    # shutdown() wakes a thread blocked in recv() on it; close() alone may not.
    import socket

    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def password_apart(url: str) -> tuple[str, str]:
    """``url`` without its password, and the password: a command line names the URL so
    (``affidavit`` refuses one holding a password there, readable in ``/proc/<pid>/cmdline``)
    and the password goes in ``PGPASSWORD``, where libpq reads it."""
    parts = urlsplit(url)
    password = parts.password or ""
    netloc = parts.netloc.replace(f":{password}@", "@", 1)
    return urlunsplit(parts._replace(netloc=netloc)), password


def argv_url(url: str, monkeypatch: Any) -> str:
    """``password_apart(url)``'s URL, its password set in this process's ``PGPASSWORD``."""
    bare, password = password_apart(url)
    monkeypatch.setenv("PGPASSWORD", password)
    return bare


def terminate_on_insert(
    cluster: Cluster,
    database: str,
    kind: str | None,
    *,
    sleep: float = 0.0,
    times: int | None = None,
    table: str = "events",
    at_commit: bool = False,
) -> None:
    """A trigger that ends its own session (``pg_terminate_backend(pg_backend_pid())``) on each
    insert into ``table`` (of an event of ``kind``; None: any row) -- a backend killed by what a
    batch writes, while new connections succeed -- after holding it ``sleep`` seconds; with
    ``times``, on the first ``times`` such inserts alone (later ones are written); with
    ``at_commit``, when the transaction commits (a deferred constraint trigger: the session is
    lost with its COMMIT sent).  ``lost_runs`` counts the inserts it met (a sequence: no
    rollback undoes it).  ``DROP TRIGGER poison ON <table>`` ends it."""
    ends = "> 0" if times is None else f"<= {int(times)}"
    once = f"nextval('poison_runs') {ends}"
    cluster.sql("CREATE SEQUENCE poison_runs", database)
    cluster.sql(
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF {once} THEN PERFORM pg_sleep({float(sleep)}); "
        "PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5); END IF; "
        "RETURN NEW; END $$",
        database,
    )
    when = "" if kind is None else f"WHEN (NEW.kind = {_literal(kind)}) "
    timing = "CONSTRAINT TRIGGER poison AFTER" if at_commit else "TRIGGER poison BEFORE"
    deferred = "DEFERRABLE INITIALLY DEFERRED " if at_commit else ""
    cluster.sql(
        f"CREATE {timing} INSERT ON {_literal(table, quote='')} {deferred}FOR EACH ROW "
        f"{when}EXECUTE FUNCTION poison()",
        database,
    )


def lost_runs(cluster: Cluster, database: str) -> int:
    """How many inserts ``terminate_on_insert``'s trigger met."""
    return int(cluster.sql("SELECT last_value FROM poison_runs", database)[0][0])


def _literal(word: str, quote: str = "'") -> str:
    assert word.isidentifier(), word  # a kind or a table: no quoting needed beyond the quotes
    return f"{quote}{word}{quote}"
