"""The documentation: every hook documented, every snippet from a file that runs here."""

from __future__ import annotations

import inspect
import itertools
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol

import anyio
import pytest

from kai_session_checkpoint_policy import PROJECT, contract, hookspecs
from kai_session_checkpoint_policy.cli import main as cli_main
from kai_session_checkpoint_policy.persistence import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT

from .support import doc_snippets

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = DOCS / "examples"
PAGES = sorted([*DOCS.glob("*.md"), *DOCS.glob("integrations/*.md")])


def hook_signatures() -> dict[str, str]:
    """Every hookspec of the contract, as ``name(arg, ...)``."""
    marker = f"{PROJECT}_spec"
    return {
        name: f"{name}({', '.join(inspect.signature(function).parameters)})"
        for name, function in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(function, marker)
    }


def example(name: str) -> dict[str, Any]:
    """The globals of an example file, loaded without running its ``__main__`` part."""
    return runpy.run_path(str(EXAMPLES / name))


# -------------------------------------------------------------------------------------------
# The host contract page
# -------------------------------------------------------------------------------------------


def test_the_contract_has_hooks() -> None:
    assert set(hook_signatures()) >= {"llm_stream", "tools_execute", "agent_pre_step"}


@pytest.mark.parametrize("name", sorted(hook_signatures()))
def test_every_hook_is_documented_under_its_signature(name: str) -> None:
    headings = re.findall(r"^#+ `([^`]+)`$", (DOCS / "host-contract.md").read_text(), re.MULTILINE)
    assert hook_signatures()[name] in headings


def test_no_heading_documents_a_hook_that_does_not_exist() -> None:
    page = (DOCS / "host-contract.md").read_text()
    documented = {
        heading.partition("(")[0]
        for heading in re.findall(r"^#+ `([a-z_]+\([^`]*\))`$", page, re.MULTILINE)
    }
    assert documented == set(hook_signatures())


# -------------------------------------------------------------------------------------------
# What a host must offer
# -------------------------------------------------------------------------------------------


def protocol_members(protocol: type) -> set[str]:
    """The members a Protocol declares, its base Protocols' included."""
    members: set[str] = set()
    for klass in protocol.__mro__:
        if klass in (object, Generic, Protocol) or klass.__module__ == "typing":
            continue
        members |= {name for name in vars(klass) if not name.startswith("_")}
        members |= set(getattr(klass, "__annotations__", {}))
    return members


def test_writing_a_host_lists_every_member_of_every_protocol() -> None:
    page = (DOCS / "writing-a-host.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| (.+) \|$", page, re.MULTILINE)
    listed = {name: set(re.findall(r"`(\w+)`", members)) for name, members in rows}
    protocols = {
        name: value
        for name, value in vars(contract).items()
        if isinstance(value, type)
        and getattr(value, "_is_protocol", False)
        and value.__module__ == contract.__name__
    }
    assert set(listed) == set(protocols)
    for name, protocol in protocols.items():
        declared = protocol_members(protocol)
        shown = listed[name]
        if "the above" in dict(rows)[name]:  # a Protocol that extends the one listed before it
            shown |= set().union(
                *(listed[base.__name__] for base in protocol.__bases__ if base.__name__ in listed)
            )
        assert shown == declared, name


def test_writing_a_host_lists_every_rule_of_the_conformance_kit() -> None:
    from kai_session_checkpoint_policy.conformance import RULES

    page = (DOCS / "writing-a-host.md").read_text()
    assert re.findall(r"^\* `([a-z-]+)`: ", page, re.MULTILINE) == list(RULES)


# -------------------------------------------------------------------------------------------
# Code blocks are the example files that run here
# -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_code_block_shows_its_example_file_exactly(page: Path) -> None:
    assert doc_snippets.rendered(page) == page.read_text(), (
        f"{page.name}: a code block differs from its example; "
        "run python tests/support/doc_snippets.py"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_code_reads_as_code_on_a_code_hosting_site(page: Path) -> None:
    text = page.read_text()
    assert "{literalinclude}" not in text
    blocks = re.findall(r"^```(\w+)\n", text, re.MULTILINE)
    marked = len(doc_snippets.MARKER.findall(text))
    python = [language for language in blocks if language in ("python", "py")]
    assert len(python) <= marked, f"{page.name}: Python written inline, not from docs/examples"


def test_every_example_is_shown_and_run() -> None:
    shown = set().union(*(doc_snippets.sources(page) for page in PAGES))
    examples = {path.resolve() for path in EXAMPLES.iterdir() if path.is_file()}
    generators = {(EXAMPLES / "sample_log.py").resolve()}  # shown through the logs it writes
    assert examples - shown - generators == set()
    tested = {"quickstart.py", "entry_points.py", "hooks.py", "recovery.py", "sample_log.py"}
    tested |= {"timeline.py", "test_host_fixtures.py", "postgres_host.py"}
    tested |= {"integration_openai_agents.py"}  # run by tests/integrations
    tested |= {"telemetry.py"}  # run by tests/test_telemetry.py
    assert {path.name for path in EXAMPLES.glob("*.py")} == tested


# -------------------------------------------------------------------------------------------
# Running the examples
# -------------------------------------------------------------------------------------------


def _inspect_json(
    root: Path | str, session_id: str, capsys: pytest.CaptureFixture[str]
) -> list[Any]:
    capsys.readouterr()
    assert cli_main(["inspect", str(root), session_id, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return [record for record in records if "type" in record]  # not the header


def test_quickstart_run_twice_resumes_the_session(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main = example("quickstart.py")["main"]
    anyio.run(main, str(tmp_path))
    first = capsys.readouterr().out
    assert "send_payment moved 120.00 EUR" in first
    assert "Invoice 1042 is paid" in first
    anyio.run(main, str(tmp_path))  # the same root: the session is resumed
    second = capsys.readouterr().out
    assert "send_payment moved" not in second  # the model saw the first turn's payment
    assert second.startswith("Invoice 1042 is paid")
    events = _inspect_json(tmp_path, "invoice-1042", capsys)
    ends = [event["data"] for event in events if event["type"] == "turn/end"]
    assert ends == [{"turn": turn, "reason": {"kind": "completed"}} for turn in (1, 2)]


@pytest.mark.usefixtures("entry_point_autoload")
def test_entry_points(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anyio.run(example("entry_points.py")["main"], str(tmp_path))
    out = capsys.readouterr().out
    assert "JsonlSessionPersistence" in out
    assert "Invoice 1042 is paid" in out
    events = _inspect_json(tmp_path, "invoice-1042", capsys)
    assert events[-1]["type"] == "turn/end"


@pytest.mark.usefixtures("entry_point_autoload")
def test_the_postgres_host_resumes_its_session_wherever_it_was_left(
    postgres_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = example("postgres_host.py")["main"]
    anyio.run(main, postgres_dsn)
    first = capsys.readouterr().out
    assert "send_payment moved 120.00 EUR" in first
    anyio.run(main, postgres_dsn, backend="trio")  # another host: the session is resumed
    second = capsys.readouterr().out
    assert "send_payment moved" not in second
    assert second.startswith("Invoice 1042 is paid")
    events = _inspect_json(postgres_dsn, "invoice-1042", capsys)
    ends = [event["data"] for event in events if event["type"] == "turn/end"]
    assert ends == [{"turn": turn, "reason": {"kind": "completed"}} for turn in (1, 2)]


def test_hook_examples(capsys: pytest.CaptureFixture[str]) -> None:
    anyio.run(example("hooks.py")["main"])
    assert capsys.readouterr().out == "every hook example ran\n"


@pytest.mark.crash
def test_recovery_example(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    anyio.run(example("recovery.py")["main"], tmp_path)
    out = capsys.readouterr().out
    assert "recovery added 11 tool/result" in out
    assert "TOOL_OUTCOME_UNKNOWN" in out
    events = _inspect_json(tmp_path, "invoice-1042", capsys)
    assert [event["seq"] for event in events] == list(range(len(events)))
    assert [event["data"]["turn"] for event in events if event["type"] == "turn/end"] == [1, 2]


@pytest.mark.parametrize(
    ("which", "golden"),
    [("complete", "sample-session.jsonl"), ("recovered", "recovered-session.jsonl")],
)
def test_sample_logs_are_what_the_backend_writes(tmp_path: Path, which: str, golden: str) -> None:
    write: Callable[[Path], Any] = example("sample_log.py")[which]
    assert anyio.run(write, tmp_path) == (EXAMPLES / golden).read_bytes()


def test_timeline_is_what_the_reporter_prints(capsys: pytest.CaptureFixture[str]) -> None:
    anyio.run(example("timeline.py")["main"])
    assert capsys.readouterr().out == (EXAMPLES / "timeline.txt").read_text()


def test_fixture_examples_pass() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(EXAMPLES)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=DOCS.parent,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert re.search(r"\b\d+ passed\b", completed.stdout)


# -------------------------------------------------------------------------------------------
# Facts quoted in prose
# -------------------------------------------------------------------------------------------


def _quoted(page: str) -> Iterator[str]:
    """The block quotes of a page, each joined into one line."""
    lines = page.splitlines()
    for is_quote, group in itertools.groupby(lines, key=lambda line: line.startswith(">")):
        if is_quote:
            yield " ".join(line.removeprefix(">").strip() for line in group)


def test_recovery_page_quotes_the_model_visible_texts() -> None:
    quotes = list(_quoted((DOCS / "recovery.md").read_text()))
    assert quotes == [OUTCOME_UNKNOWN_TEXT, NOT_STARTED_TEXT]


# -------------------------------------------------------------------------------------------
# Building
# -------------------------------------------------------------------------------------------


def test_docs_build_without_warnings(tmp_path: Path) -> None:
    pytest.importorskip("sphinx", reason="install the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("myst_parser", reason="install the docs extra: pip install -e '.[docs]'")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    completed = subprocess.run(
        [*command, str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert completed.returncode == 0, completed.stderr
