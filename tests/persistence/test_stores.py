"""Store URLs: which backend a URL opens, and how a URL is shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from kai_session_checkpoint_policy import cli
from kai_session_checkpoint_policy.persistence import (
    JsonlSessionPersistence,
    display_url,
    is_postgres_url,
    open_store,
)


@pytest.mark.parametrize(
    ("url", "postgres"),
    [
        ("postgresql:///kai", True),
        ("postgres://db.example/kai", True),
        ("postgresql-data/sessions", False),
        ("/srv/sessions", False),
        (Path("postgresql://not-a-uri"), False),  # a path, whatever its name
    ],
)
def test_a_store_url_is_a_postgres_uri_or_a_directory(url: str | Path, postgres: bool) -> None:
    assert is_postgres_url(url) is postgres


def test_open_store_chooses_the_backend_and_passes_its_settings(tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="the PostgreSQL backend needs psycopg")
    from kai_session_checkpoint_policy.persistence import PostgresSessionPersistence

    jsonl = open_store(tmp_path, batch_window=0.5)
    postgres = open_store("postgresql:///kai?host=/nowhere", batch_window=0.5, lease_ttl=3)

    assert isinstance(jsonl, JsonlSessionPersistence)
    assert (jsonl.root, jsonl.batch_window) == (tmp_path, 0.5)
    assert isinstance(postgres, PostgresSessionPersistence)
    assert (postgres.batch_window, postgres.lease_ttl) == (0.5, 3.0)
    assert not (tmp_path / "kai").exists()  # nothing opened or created
    with pytest.raises(ValueError, match=r"^a lease ttl applies to a PostgreSQL store only, not"):
        open_store(tmp_path, lease_ttl=3)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("/srv/sessions", "/srv/sessions"),
        ("postgresql:///kai?host=/run/pg&port=5432", "postgresql:///kai?host=/run/pg&port=5432"),
        ("postgresql://kai:s3cret@db.example:5432/kai", "postgresql://kai:***@db.example:5432/kai"),
        ("postgresql://kai@db.example/kai", "postgresql://kai@db.example/kai"),
        (
            "postgres://db.example/kai?user=kai&password=s3cret&sslmode=require",
            "postgres://db.example/kai?user=kai&password=***&sslmode=require",
        ),
    ],
)
def test_a_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert display_url(url) == shown


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        (["--lease-ttl", "2"], "--lease-ttl applies to a postgresql:// store, not to {root}"),
        (["--hang-for", "2"], "--hang-for goes with --hang-at"),
    ],
)
def test_the_agents_store_options_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], problem: str
) -> None:
    status = cli.main(["agent", "--root", str(tmp_path), "--session", "s", *options])
    captured = capsys.readouterr()
    assert (status, captured.out) == (cli.EXIT_BAD_INPUT, "")
    assert captured.err == f"kai-checkpoint: {problem.format(root=tmp_path)}\n"
    assert list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.parametrize("option", ["--hang-for", "--lease-ttl"])
def test_the_agents_seconds_must_be_positive(
    capsys: pytest.CaptureFixture[str], option: str
) -> None:
    with pytest.raises(SystemExit) as refused:
        cli.main(["agent", "--root", "r", "--session", "s", option, "0"])
    assert refused.value.code == cli.EXIT_BAD_INPUT
    assert f"argument {option}: not a positive number of seconds: '0'" in capsys.readouterr().err
