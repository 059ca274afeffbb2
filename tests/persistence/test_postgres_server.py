"""The tests' own PostgreSQL server: how it is found, started, restarted and stopped."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ..support import postgres_server as pg
from ..support.readme_pair import ROOT

pytest_plugins = ["pytester"]

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL tests need psycopg")


def test_nothing_found_in_empty_places_is_named(tmp_path: Path) -> None:
    assert pg.find_binaries(path=str(tmp_path), debian_root=tmp_path) is None
    problem = pg.missing(None)

    assert problem == (
        "no PostgreSQL server programs (initdb, pg_ctl, postgres) on PATH, in "
        "'pg_config --bindir' or in /usr/lib/postgresql/*/bin"
    )


def test_the_newest_debian_version_is_found(tmp_path: Path) -> None:
    for version in ("9.6", "15", "13"):
        bindir = tmp_path / version / "bin"
        bindir.mkdir(parents=True)
        for program in pg.PROGRAMS:
            (bindir / program).touch(mode=0o755)

    found = pg.find_binaries(path=str(tmp_path / "nowhere"), debian_root=tmp_path)

    assert found == pg.Binaries.in_directory(tmp_path / "15" / "bin")
    assert found is not None
    assert found.postgres == tmp_path / "15" / "bin" / "postgres"


@pytest.mark.parametrize("setting", ["1", None])
def test_missing_programs_skip_unless_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setting: str | None
) -> None:
    if setting is None:
        monkeypatch.delenv(pg.REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(pg.REQUIRE_ENV, setting)
    nothing = pg.find_binaries(path=str(tmp_path), debian_root=tmp_path)
    problem = pg.missing(None)

    if setting == "1":
        with pytest.raises(pytest.UsageError) as refused:
            pg.check_required(nothing)
        assert str(refused.value) == (
            f"KAI_REQUIRE_POSTGRES=1, but the PostgreSQL tests cannot run: {problem}"
        )
        with pytest.raises(pytest.fail.Exception, match="KAI_REQUIRE_POSTGRES=1, but"):
            pg.require_binaries(nothing)
    else:
        pg.check_required(nothing)  # nothing required: the run goes on
        with pytest.raises(pytest.skip.Exception) as skipped:
            pg.require_binaries(nothing)
        assert str(skipped.value) == f"the PostgreSQL tests need what is missing here: {problem}"


def test_the_server_is_configured_as_required(postgres_server: pg.PostgresServer) -> None:
    with psycopg.connect(postgres_server.dsn) as connection:
        settings = dict(
            connection.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["listen_addresses", "unix_socket_directories", "fsync", "synchronous_commit"],),
            ).fetchall()
        )
        database, user = connection.execute("SELECT current_database(), current_user").fetchone()

    assert settings == {
        "listen_addresses": "",
        "unix_socket_directories": str(postgres_server.socket_dir),
        "fsync": "on",
        "synchronous_commit": "on",
    }
    assert (database, user) == (pg.TEST_DATABASE, pg.SUPERUSER)
    server_pid = int((postgres_server.data / "postmaster.pid").read_text().split()[0])
    if os.geteuid() == 0:  # PostgreSQL refuses root: the server runs unprivileged
        assert os.stat(f"/proc/{server_pid}").st_uid != 0


@pytest.mark.parametrize("run", [1, 2])
def test_each_test_has_a_fresh_database(postgres_dsn: str, run: int) -> None:
    with psycopg.connect(postgres_dsn) as connection:
        tables = connection.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', "
            "'information_schema')"
        ).fetchone()
        connection.execute("CREATE TABLE left_behind (x int)")  # the next test must not see it

    assert tables == (0,)


def test_restart_stop_start_and_terminate(postgres_server: pg.PostgresServer) -> None:
    with psycopg.connect(postgres_server.dsn, autocommit=True) as connection:
        connection.execute("CREATE TABLE IF NOT EXISTS kept (x int)")
        connection.execute("INSERT INTO kept VALUES (1)")
    postgres_server.restart("immediate")  # as a crash: the committed row survives
    with psycopg.connect(postgres_server.dsn, autocommit=True) as connection:
        assert connection.execute("SELECT count(*) FROM kept").fetchone() == (1,)
        connection.execute("DROP TABLE kept")

    postgres_server.stop()
    assert not postgres_server.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(postgres_server.dsn, connect_timeout=2)
    postgres_server.start()

    victims = [psycopg.connect(postgres_server.dsn, application_name="victim") for _ in range(2)]
    bystander = psycopg.connect(postgres_server.dsn, application_name="bystander")
    try:
        assert postgres_server.terminate_backends("victim") == 2
        for victim in victims:
            with pytest.raises(psycopg.OperationalError):
                victim.execute("SELECT 1")
        assert bystander.execute("SELECT 1").fetchone() == (1,)
    finally:
        for connection in [*victims, bystander]:
            connection.close()


INNER_TESTS = """
def test_fails(postgres_server, postgres_dsn):
    print("BASE", postgres_server.base)
    assert False, "this test fails on purpose"
"""


def test_a_failing_test_leaves_no_server_behind(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("from tests.conftest import postgres_dsn, postgres_server\n")
    pytester.makepyfile(test_inner=INNER_TESTS)

    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")

    result.assert_outcomes(failed=1)
    [base] = [match[1] for line in result.outlines if (match := re.search(r"BASE (\S+)", line))]
    assert not Path(base).exists()
    running = [
        cmdline
        for cmdline in (path.read_bytes() for path in Path("/proc").glob("[0-9]*/cmdline"))
        if base.encode() in cmdline
    ]
    assert running == []
