"""Where the tests get a PostgreSQL: POSTGRES_URL, the local server on 5432, or a cluster of our own.

Tests never clutter a database they did not create: each test gets a schema of its own
(the ``pg_schema`` fixture in conftest.py) and drops it afterwards.
"""
from __future__ import annotations

import contextlib
import glob
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from typing import Iterator, Optional, Sequence

from tests._ports import free_port

__all__ = ["PostgresServer", "free_port", "postgres_for_tests"]

LOCAL_URL = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin/" + name), reverse=True):
        return candidate
    raise RuntimeError(f"{name} is not on PATH: install PostgreSQL (apt-get install postgresql, or "
                       "`make setup`) or set POSTGRES_URL")


class PostgresServer:
    """A throw-away cluster (initdb + pg_ctl) on a free loopback port, in a temporary directory.

    initdb refuses to run as root, so as root the cluster is made and run as the ``postgres`` OS user.

    ``ssl_files=(certificate, key)`` (e.g. from ``tests._tls.make_pki``) starts it with ``ssl=on``
    (copies of the files live in the cluster's directory, gone with it); ``hba`` replaces
    ``pg_hba.conf`` (lines as written there), e.g. to ask roles for a password -- keep a ``trust``
    line for ``postgres`` on 127.0.0.1, which `url` and the start check use. ``listen`` adds addresses
    to listen on besides 127.0.0.1 (e.g. a veth end, tests/netns_helpers.py).
    """

    def __init__(self, *, ssl_files: Optional[tuple[str, str]] = None, hba: Optional[Sequence[str]] = None,
                 listen: Sequence[str] = ()) -> None:
        self.ssl_files = ssl_files
        self.listen = list(listen)  # addresses to listen on besides 127.0.0.1 (add hba lines for them)
        self.hba = list(hba) if hba is not None else None
        self.port = free_port()  # start() takes another one if this one is taken meanwhile
        self.dir = tempfile.mkdtemp(prefix="bullmq-compat-pg-")
        self.data = os.path.join(self.dir, "data")
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.dir, "postgres")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        command = list(argv)
        if self._as_postgres:
            if shutil.which("runuser"):
                command = ["runuser", "-u", "postgres", "--", *argv]
            elif shutil.which("su"):
                command = ["su", "postgres", "-s", "/bin/sh", "-c", shlex.join(argv)]
            else:
                raise RuntimeError("running as root without runuser or su: cannot run initdb as 'postgres'")
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start(self) -> "PostgresServer":
        self._run(_binary("initdb"), "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        if self.ssl_files is not None:
            cert, key = (os.path.join(self.dir, name) for name in ("server.crt", "server.key"))
            for source, target in zip(self.ssl_files, (cert, key)):
                shutil.copyfile(source, target)
                os.chmod(target, 0o600)
                if self._as_postgres:
                    shutil.chown(target, "postgres")
        if self.hba is not None:
            hba_file = os.path.join(self.data, "pg_hba.conf")
            with open(hba_file, "w") as f:
                f.write("\n".join(self.hba) + "\n")
            if self._as_postgres:
                shutil.chown(hba_file, "postgres")
        for attempt in range(4):
            try:
                return self.boot()
            except subprocess.CalledProcessError:
                if attempt == 3:
                    raise
                self.port = free_port()  # pg_ctl fails when the port was taken meanwhile
        raise AssertionError("unreachable")

    def boot(self) -> "PostgresServer":
        """Start the (already made) cluster on its port and wait until it answers."""
        addresses = ",".join(["127.0.0.1", *self.listen])
        options = f"-p {self.port} -c listen_addresses={addresses} -k {self.dir} -c fsync=off"
        if self.ssl_files is not None:
            cert, key = (os.path.join(self.dir, name) for name in ("server.crt", "server.key"))
            options += f" -c ssl=on -c ssl_cert_file={cert} -c ssl_key_file={key}"
        self._run(_binary("pg_ctl"), "-D", self.data, "-w", "-l", os.path.join(self.dir, "log"), "-o",
                  options, "start")
        deadline = time.monotonic() + 60
        while not _answers(self.url):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test PostgreSQL did not start on port {self.port}")
            time.sleep(0.1)
        return self

    def halt(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: every session is terminated, as in a restart), keeping its data."""
        self._run(_binary("pg_ctl"), "-D", self.data, "-m", mode, "-w", "stop")

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, RuntimeError):
            self._run(_binary("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def postgres_for_tests() -> Iterator[str]:
    """Yield a PostgreSQL URL for the test session, starting (and later stopping) a cluster when needed."""
    url = os.environ.get("POSTGRES_URL")
    if url:
        yield url
        return
    if _answers(LOCAL_URL):
        yield LOCAL_URL
        return
    server = PostgresServer().start()
    try:
        yield server.url
    finally:
        server.stop()
