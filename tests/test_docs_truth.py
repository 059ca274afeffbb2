"""Docs that stay true: what the pages name is what the code has, both ways.

Each check is a function of the code's names and a page's text, run on the real page and on a
broken one it must catch: the entry points, the host options, every subcommand's command-line
options, and the exported names.
"""

from __future__ import annotations

import argparse
import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Final

import pytest

import kai_session_checkpoint_policy
from kai_session_checkpoint_policy import cli

DOCS: Final = Path(__file__).resolve().parent.parent / "docs"
PAGES: Final = sorted([*DOCS.glob("*.md"), *DOCS.glob("integrations/*.md")])


def mismatch(code: set[str], documented: set[str]) -> tuple[list[str], list[str]]:
    """What the code has and the page does not name, and what the page names that the code
    does not have."""
    return sorted(code - documented), sorted(documented - code)


# -- entry points -------------------------------------------------------------------------------


def declared_entry_points() -> set[str]:
    return {entry.name for entry in entry_points(group="kai")}


def documented_entry_points(text: str) -> set[str]:
    """The first column of the host contract's table of entry points."""
    return set(re.findall(r"^\| `([a-z-]+)` \|", text, re.MULTILINE))


def test_the_host_contract_names_every_entry_point_and_no_other() -> None:
    page = (DOCS / "host-contract.md").read_text()
    assert len(declared_entry_points()) == 4
    assert mismatch(declared_entry_points(), documented_entry_points(page)) == ([], [])
    broken = page.replace("| `session-persistence-postgres` |", "| `session-persistence-pg` |")
    assert mismatch(declared_entry_points(), documented_entry_points(broken)) == (
        ["session-persistence-postgres"],
        ["session-persistence-pg"],
    )


# -- host options -------------------------------------------------------------------------------

MISTYPED_ON_PURPOSE: Final = {"jsonl.roots"}
"""Named by the host contract as an option that does not exist."""


def declared_options() -> set[str]:
    """The host options the entry points' plugins declare."""
    names: set[str] = set()
    for entry in entry_points(group="kai"):
        declare = getattr(entry.load(), "host_declare_options", None)
        names |= set(declare() or {}) if declare is not None else set()
    return names


def documented_options(text: str, prefixes: set[str]) -> set[str]:
    """Every `` `prefix.name` `` the page writes with a prefix of the declared options."""
    found = set(re.findall(r"`([a-z]+\.[a-z_]+)`", text))
    return {name for name in found if name.split(".")[0] in prefixes} - MISTYPED_ON_PURPOSE


def test_the_host_contract_names_every_host_option_and_no_other() -> None:
    page = (DOCS / "host-contract.md").read_text()
    declared = declared_options()
    prefixes = {name.split(".")[0] for name in declared}
    assert prefixes == {"checkpoint", "jsonl", "postgres"}
    assert mismatch(declared, documented_options(page, prefixes)) == ([], [])
    broken = page.replace("`postgres.lease_ttl`", "`postgres.lease`")
    assert mismatch(declared, documented_options(broken, prefixes)) == (
        ["postgres.lease_ttl"],
        ["postgres.lease"],
    )


# -- command-line options -----------------------------------------------------------------------


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    (commands,) = (
        action for action in parser._actions if isinstance(action, argparse._SubParsersAction)
    )
    return dict(commands.choices)


def options_of(command: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in command._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


def sections(text: str) -> dict[str, str]:
    """The text of each ``## `kai-checkpoint NAME ...` `` section (its subsections included),
    by command name; the "Big logs" section belongs to ``inspect`` and ``recover``."""
    found: dict[str, str] = {}
    for part in re.split(r"^(?=## )", text, flags=re.MULTILINE):
        named = re.match(r"## `kai-checkpoint ([a-z]+)", part)
        if named:
            found[named[1]] = found.get(named[1], "") + part
        elif part.startswith("## Big logs"):
            for name in ("inspect", "recover"):
                found[name] = found.get(name, "") + part
    return found


OPTION: Final = re.compile(r"(?<![\w-])(--[a-z][a-z-]*[a-z])(?![\w-])")
OTHER_COMMAND: Final = re.compile(r"`kai-checkpoint ([a-z]+)[^`]*`")


def documented_cli_options(text: str) -> dict[str, set[str]]:
    """The options each command's section names, but for those of another command's
    command line quoted there (``kai-checkpoint agent --hang-at tool`` in ``demo``'s)."""

    def own(name: str, section: str) -> str:
        return OTHER_COMMAND.sub(lambda quoted: quoted[0] if quoted[1] == name else "", section)

    found = sections(text)
    return {name: set(OPTION.findall(own(name, section))) for name, section in found.items()}


def cli_mismatches(text: str) -> dict[str, tuple[list[str], list[str]]]:
    documented = documented_cli_options(text)
    found = {}
    for name, command in subcommands().items():
        difference = mismatch(options_of(command), documented.get(name, set()))
        if difference != ([], []):
            found[name] = difference
    return found


def test_every_subcommand_has_a_section_naming_its_options_and_no_other() -> None:
    page = (DOCS / "command-line.md").read_text()
    assert set(sections(page)) == set(subcommands())
    assert cli_mismatches(page) == {}
    broken = page.replace("--batch-window", "--batch").replace("`--tail N`", "`--last N`")
    assert cli_mismatches(broken) == {
        "agent": (["--batch-window"], ["--batch"]),
        "inspect": ([], ["--last"]),
        "recover": ([], ["--last"]),
    }


def test_every_subcommand_describes_itself_in_its_help() -> None:
    for name, command in subcommands().items():
        assert command.description, f"{name} --help describes nothing"
        assert len(command.description.split()) >= 8, name


# -- exported names -----------------------------------------------------------------------------


def documented_names(text: str) -> set[str]:
    """The names the API reference documents (``.. autoclass:: kai_session_checkpoint_policy.X``
    and the like)."""
    return set(re.findall(r"^\.\. auto\w+:: kai_session_checkpoint_policy\.(\w+)$", text, re.M))


def test_the_api_reference_documents_every_exported_name_and_no_other() -> None:
    page = (DOCS / "api.md").read_text()
    exported = set(kai_session_checkpoint_policy.__all__) - {"__version__"}
    assert mismatch(exported, documented_names(page)) == ([], [])
    broken = page.replace(
        ".. autoclass:: kai_session_checkpoint_policy.Host\n",
        ".. autoclass:: kai_session_checkpoint_policy.Hosts\n",
    )
    assert mismatch(exported, documented_names(broken)) == (["Host"], ["Hosts"])


# -- links that read on a code host -------------------------------------------------------------

ROLE: Final = re.compile(r"(?<!`)\{[a-z:-]+\}`")
"""A MyST role (``{doc}`x` ``), not a unit in code (`` `{event}` ``)."""


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_no_page_has_a_role_a_code_host_shows_raw(page: Path) -> None:
    assert ROLE.findall(page.read_text()) == []
    assert ROLE.findall("see {doc}`recovery`") == ["{doc}`"]
    assert ROLE.findall("a counter, `{batch}` each") == []
