"""A PostgreSQL server of the tests' own, started from the server binaries on the machine.

:meth:`PostgresServer.start_new` runs ``initdb`` into a fresh temporary directory (trust
authentication, which only a local socket reaches) and starts the server listening on nothing
but a Unix socket in another temporary directory, with ``fsync`` and ``synchronous_commit`` on,
as a server in production would be. Run as root, the server runs as the ``postgres`` system user
(or ``nobody``): PostgreSQL refuses to run as root. Readiness is ``pg_ctl -w``, never a sleep.

Administrative queries go through psycopg, imported only when one is made, so this module (and
:func:`missing`) can tell what is missing on a machine without psycopg.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING, Final, Literal
from urllib.parse import quote

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    import psycopg

__all__ = [
    "REQUIRE_ENV",
    "Binaries",
    "PostgresServer",
    "check_required",
    "find_binaries",
    "missing",
    "require_binaries",
]

REQUIRE_ENV: Final = "KAI_REQUIRE_POSTGRES"
"""Set to ``1`` to make the PostgreSQL tests fail, instead of skip, when something is missing."""

PROGRAMS: Final = ("initdb", "pg_ctl", "postgres")
SUPERUSER: Final = "postgres"
PORT: Final = 5432
"""The port names the socket file; each server has a socket directory of its own."""
TEST_DATABASE: Final = "kai_test"
TEMPLATE_DATABASE: Final = "kai_template"
PG_CTL_TIMEOUT: Final = 60
"""Seconds ``pg_ctl -w`` waits for the server to start or stop."""
TERMINATE_TIMEOUT_MS: Final = 10_000
"""How long ``pg_terminate_backend`` waits for a backend to be gone."""

ShutdownMode = Literal["smart", "fast", "immediate"]


@dataclass(frozen=True, slots=True)
class Binaries:
    """Where the server programs are."""

    initdb: Path
    pg_ctl: Path
    postgres: Path

    @classmethod
    def in_directory(cls, directory: Path) -> Binaries | None:
        paths = [directory / program for program in PROGRAMS]
        if not all(os.access(path, os.X_OK) for path in paths):
            return None
        return cls(*paths)


def _version_key(bindir: Path) -> tuple[int, ...]:
    """``/usr/lib/postgresql/15/bin`` sorts by ``(15,)``; a name that is not a version first."""
    return tuple(int(part) for part in re.findall(r"\d+", bindir.parent.name)) or (-1,)


def find_binaries(
    path: str | None = None, debian_root: Path = Path("/usr/lib/postgresql")
) -> Binaries | None:
    """The server programs: on *path* (``PATH`` by default), else in ``pg_config --bindir``,
    else in the newest ``<debian_root>/*/bin`` (Debian keeps them off ``PATH``)."""
    on_path = [shutil.which(program, path=path) for program in PROGRAMS]
    if all(on_path):
        # Resolved, so that initdb finds the postgres beside it, not beside a symbolic link.
        return Binaries(*(Path(found).resolve() for found in on_path if found))
    pg_config = shutil.which("pg_config", path=path)
    if pg_config is not None:
        result = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if result.returncode == 0 and result.stdout.strip():
            found = Binaries.in_directory(Path(result.stdout.strip()))
            if found is not None:
                return found
    for bindir in sorted(debian_root.glob("*/bin"), key=_version_key, reverse=True):
        found = Binaries.in_directory(bindir)
        if found is not None:
            return found
    return None


def missing(binaries: Binaries | None) -> str | None:
    """What the PostgreSQL tests need and this machine lacks (given the *binaries* found),
    or ``None``."""
    problems: list[str] = []
    packages = [
        name for name in ("psycopg", "psycopg_pool") if importlib.util.find_spec(name) is None
    ]
    if packages:
        names = " and ".join(packages)
        verb = "are" if len(packages) > 1 else "is"
        problems.append(f"{names} {verb} not installed (pip install -e '.[postgres]')")
    if binaries is None:
        problems.append(
            "no PostgreSQL server programs (initdb, pg_ctl, postgres) on PATH, in "
            "'pg_config --bindir' or in /usr/lib/postgresql/*/bin"
        )
    return "; ".join(problems) or None


def required() -> bool:
    """Whether the environment asks for the PostgreSQL tests to fail rather than skip."""
    return os.environ.get(REQUIRE_ENV) == "1"


def check_required(binaries: Binaries | None) -> None:
    """With ``KAI_REQUIRE_POSTGRES=1``, refuse to run without what the PostgreSQL tests need
    (given the *binaries* found).

    :raises pytest.UsageError: naming what is missing.
    """
    problem = missing(binaries)
    if required() and problem is not None:
        raise pytest.UsageError(f"{REQUIRE_ENV}=1, but the PostgreSQL tests cannot run: {problem}")


def require_binaries(binaries: Binaries | None) -> Binaries:
    """The server programs, once psycopg is known to be there too; otherwise skip (fail with
    ``KAI_REQUIRE_POSTGRES=1``), naming what is missing."""
    problem = missing(binaries)
    if problem is None:
        assert binaries is not None
        return binaries
    if required():
        pytest.fail(f"{REQUIRE_ENV}=1, but the PostgreSQL tests cannot run: {problem}")
    pytest.skip(f"the PostgreSQL tests need what is missing here: {problem}")


def _server_account() -> tuple[int, int] | None:
    """The (uid, gid) to run the server as: ``None`` unless running as root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            account = pwd.getpwnam(name)
            return account.pw_uid, account.pw_gid
    raise RuntimeError(
        "running as root, and there is neither a 'postgres' nor a 'nobody' user to run the "
        "PostgreSQL server as (it refuses to run as root)"
    )


class PostgresServer:
    """One running PostgreSQL server in a temporary directory; use :meth:`start_new`."""

    def __init__(self, binaries: Binaries, base: Path, account: tuple[int, int] | None) -> None:
        self.binaries = binaries
        self.base = base
        self.data = base / "data"
        self.socket_dir = base / "socket"
        self.log = base / "server.log"
        self._account = account
        self._databases = count(1)
        self.dsn: Final = self.dsn_for(TEST_DATABASE)
        """The database created for the tests (shared by every user of this server)."""

    @classmethod
    @contextlib.contextmanager
    def start_new(
        cls, binaries: Binaries, settings: Mapping[str, str] | None = None
    ) -> Iterator[PostgresServer]:
        """Create, start and yield a server; stop it and remove its directories on exit.

        *settings*: ``postgresql.conf`` settings beside (or instead of) the tests' own.
        """
        account = _server_account()
        base = Path(tempfile.mkdtemp(prefix="kai-pg-"))
        try:
            server = cls(binaries, base, account)
            socket_path = server.socket_dir / f".s.PGSQL.{PORT}"
            if len(os.fsencode(socket_path)) > 100:  # sun_path holds 108 bytes, NUL included
                raise RuntimeError(f"the socket path {socket_path} is too long for a Unix socket")
            server.socket_dir.mkdir()
            if account is not None:
                for path in (base, server.socket_dir):
                    os.chown(path, *account)
            server._initdb(settings or {})
            server.start()
            try:
                with server.admin() as admin:
                    admin.execute(f"CREATE DATABASE {TEST_DATABASE}")
                    admin.execute(f"CREATE DATABASE {TEMPLATE_DATABASE} IS_TEMPLATE true")
                yield server
            finally:
                server.stop("immediate")  # nothing in it is worth a clean shutdown
        finally:
            shutil.rmtree(base, ignore_errors=True)

    # -- programs -----------------------------------------------------------------------------

    def _run(self, *command: str | Path, ok: tuple[int, ...] = (0,)) -> int:
        """Run *command* as the server's account; unless it exits with a status in *ok*, fail
        showing its output and the end of the server log."""
        environment = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        environment["LC_ALL"] = "C"
        uid, gid = self._account if self._account is not None else (None, None)
        # Output goes to a file, not a pipe: the server that pg_ctl starts inherits it, and
        # would hold a pipe open (and so this call waiting) for as long as it runs.
        with tempfile.TemporaryFile("w+") as output:
            result = subprocess.run(
                [str(part) for part in command],
                cwd=self.base,  # readable by the server's account, unlike root's working directory
                env=environment,
                user=uid,
                group=gid,
                extra_groups=[] if self._account is not None else None,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                text=True,
            )
            output.seek(0)
            printed = output.read()
        if result.returncode not in ok:
            log = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
            raise RuntimeError(
                f"{' '.join(map(str, command))} exited with {result.returncode}:\n"
                f"{printed}\nserver log:\n{log[-4000:]}"
            )
        return result.returncode

    def _initdb(self, overrides: Mapping[str, str]) -> None:
        self._run(
            self.binaries.initdb,
            "--pgdata",
            self.data,
            "--username",
            SUPERUSER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            # initdb's own final fsync only: the server below runs with fsync on, and a
            # restart in the tests kills the server, not the machine.
            "--no-sync",
        )
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "port": str(PORT),
            "fsync": "on",
            "synchronous_commit": "on",
            "full_page_writes": "on",
            "max_connections": "50",
            "shared_buffers": "32MB",
            **overrides,
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# Set by the tests\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    def _pg_ctl(self, *arguments: str, ok: tuple[int, ...] = (0,)) -> int:
        return self._run(self.binaries.pg_ctl, "--pgdata", self.data, *arguments, ok=ok)

    def start(self) -> None:
        """Start the server; return once it accepts connections."""
        self._pg_ctl(
            "start",
            "--wait",
            f"--timeout={PG_CTL_TIMEOUT}",
            f"--log={self.log}",
            "-p",
            str(self.binaries.postgres),
        )

    def stop(self, mode: ShutdownMode = "fast") -> None:
        """Stop the server (``immediate``: as a crash would); return once it is gone."""
        if self.is_running():
            self._pg_ctl("stop", "--wait", f"--timeout={PG_CTL_TIMEOUT}", f"--mode={mode}")

    def restart(self, mode: ShutdownMode = "immediate") -> None:
        """Stop the server (by default as a crash would) and start it again; return once ready.

        After an ``immediate`` stop the server recovers from its write-ahead log, so what it
        acknowledged before is all there, and nothing else.
        """
        self._pg_ctl(
            "restart",
            "--wait",
            f"--timeout={PG_CTL_TIMEOUT}",
            f"--mode={mode}",
            f"--log={self.log}",
            "-p",
            str(self.binaries.postgres),
        )

    def is_running(self) -> bool:
        return self._pg_ctl("status", ok=(0, 3)) == 0  # 3: not running

    def ensure_running(self) -> None:
        """Start the server if a test stopped it."""
        if not self.is_running():
            self.start()

    # -- databases and connections ------------------------------------------------------------

    def dsn_for(self, database: str) -> str:
        """The libpq URI of *database* on this server."""
        return (
            f"postgresql:///{database}?host={quote(str(self.socket_dir))}"
            f"&port={PORT}&user={SUPERUSER}"
        )

    def admin(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """A new autocommit connection to *database*, as the superuser."""
        import psycopg

        return psycopg.connect(
            self.dsn_for(database), autocommit=True, application_name="kai-test-admin"
        )

    def create_database(self) -> str:
        """Create a new, empty database from the template; return its name."""
        name = f"kai_test_{next(self._databases)}"
        with self.admin() as admin:
            admin.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DATABASE}")
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def terminate_backends(self, application_name: str | None = None) -> int:
        """Terminate every other client connection (only those of *application_name*, if
        given) and wait until they are gone; return how many there were."""
        with self.admin() as admin:
            row = admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, %s)) "
                "FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid() "
                "AND (%s::text IS NULL OR application_name = %s::text)",
                (TERMINATE_TIMEOUT_MS, application_name, application_name),
            ).fetchone()
        assert row is not None
        terminated = row[0]
        assert isinstance(terminated, int)
        return terminated
