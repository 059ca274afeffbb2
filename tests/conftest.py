from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

from kai_session_checkpoint_policy.host import AUTOLOAD_ENV

from .support import postgres_server as pg

if TYPE_CHECKING:
    from collections.abc import Iterator

settings.register_profile("ci", max_examples=200, deadline=None)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_configure(config: pytest.Config) -> None:
    # The one switch for the whole run: no host built in this process, or in a child process
    # that inherits its environment, loads the ``kai`` entry points installed here; each host
    # has only the plugins its test gives it. A test of autoloading turns it back on with the
    # ``entry_point_autoload`` fixture.
    environment = pytest.MonkeyPatch()
    environment.setenv(AUTOLOAD_ENV, "1")
    config.add_cleanup(environment.undo)
    pg.check_required(pg.find_binaries())


@pytest.fixture
def entry_point_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entry-point autoloading back on for one test, which the rest of the run keeps off."""
    monkeypatch.delenv(AUTOLOAD_ENV)


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[pg.PostgresServer]:
    """A PostgreSQL server of the test session's own, stopped and removed at its end.

    Skipped, naming what is missing, when psycopg or the server programs are not there (the
    run fails instead when ``KAI_REQUIRE_POSTGRES=1``).
    """
    binaries = pg.require_binaries(pg.find_binaries())
    with pg.PostgresServer.start_new(binaries) as server:
        yield server


@pytest.fixture
def postgres_dsn(postgres_server: pg.PostgresServer) -> Iterator[str]:
    """The URI of a new, empty database of its own for one test, dropped afterwards."""
    postgres_server.ensure_running()  # an earlier test may have stopped it, and failed
    database = postgres_server.create_database()
    try:
        yield postgres_server.dsn_for(database)
    finally:
        postgres_server.ensure_running()
        postgres_server.drop_database(database)
