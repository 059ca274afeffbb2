"""README.md, README.zh.md and their record stay in step; CI runs the README's test command."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from .support import readme_pair
from .support.readme_pair import ROOT, SIDES

DEMO_COMMAND = "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/kai-checkpoint demo"
TEST_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
)


def read(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def test_the_record_matches_both_sides() -> None:
    stale = readme_pair.stale_sides()
    assert not stale, (
        f"{', '.join(stale)} changed since README.i18n.yaml was recorded: bring the other "
        "language along, then run 'python -m tests.support.readme_pair --write'"
    )


def test_the_record_names_exactly_the_two_sides() -> None:
    assert set(readme_pair.recorded()) == set(SIDES)


def test_one_changed_side_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    record = readme_pair.recorded()
    monkeypatch.setattr(
        readme_pair,
        "current",
        lambda: {**record, "README.zh.md": readme_pair.blob_hash(b"changed\n")},
    )
    assert readme_pair.stale_sides() == ["README.zh.md"]


def test_blob_hash_is_gits() -> None:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a work tree")
    for side in SIDES:
        printed = subprocess.run(
            [git, "hash-object", side], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        assert readme_pair.blob_hash((ROOT / side).read_bytes()) == printed


@pytest.mark.parametrize("side", SIDES)
def test_starts_with_the_title_then_the_two_commands(side: str) -> None:
    lines = read(side).splitlines()
    assert lines[:6] == [
        "# kai-session-checkpoint-policy",
        "",
        "```bash",
        DEMO_COMMAND,
        TEST_COMMAND,
        "```",
    ]


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    assert TEST_COMMAND in read(".ci/run").splitlines()


def test_the_readme_example_is_the_quickstart_file() -> None:
    text = read("docs/examples/quickstart.py")
    body = text.partition("# example: start\n")[2].partition("# example: end\n")[0]
    assert fenced(read("README.md"), "python") == [body.strip("\n") + "\n"]


def test_both_sides_show_the_same_commands_and_code() -> None:
    english, chinese = (read(side) for side in SIDES)
    for language in ("bash", "python"):
        assert fenced(english, language) == fenced(chinese, language)


@pytest.mark.parametrize("side", [*SIDES, "CHANGELOG.md"])
def test_relative_links_resolve(side: str) -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", read(side)):
        if "://" not in target:
            assert (ROOT / target).exists(), f"{side} links to missing {target}"


def test_both_sides_link_the_same_documents() -> None:
    english, chinese = (
        re.findall(r"\]\(((?:docs/|CHANGELOG|LICENSE)[^)]*)\)", read(side)) for side in SIDES
    )
    assert english == chinese
