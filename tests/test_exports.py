"""``__all__`` of the re-exporting packages is exactly their public surface, sorted; and only
the PostgreSQL store needs the PostgreSQL driver."""

from __future__ import annotations

import re
import subprocess
import sys
from types import ModuleType

import pytest

import kai_session_checkpoint_policy as package
from kai_session_checkpoint_policy import host, persistence

EXPORTED_MODULES = {package: {"invariant", "policy"}, host: set(), persistence: set()}


def isort_style(name: str) -> tuple[int, str]:
    """The order ruff's RUF022 keeps: CONSTANTS, then CamelCase, then everything else."""
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
        return 0, name
    if name[0].isupper():
        return 1, name
    return 2, name


def public_names(module: ModuleType) -> set[str]:
    """Names a user sees on *module*, leaving out submodules it merely imported."""
    return {
        name
        for name in dir(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), ModuleType)
    }


@pytest.mark.parametrize("module", [package, host, persistence], ids=lambda module: module.__name__)
def test_all_is_sorted_without_duplicates(module: ModuleType) -> None:
    exported: list[str] = module.__all__

    assert exported == sorted(exported, key=isort_style)
    assert len(set(exported)) == len(exported)


@pytest.mark.parametrize("module", [package, host, persistence], ids=lambda module: module.__name__)
def test_all_is_exactly_the_public_surface(module: ModuleType) -> None:
    exported = set(module.__all__)
    modules = {name for name in exported if isinstance(getattr(module, name), ModuleType)}

    assert modules == EXPORTED_MODULES[module]
    assert exported - modules - {"__version__"} == public_names(module)


WITHOUT_DRIVER = """
import sys
sys.modules["psycopg"] = sys.modules["psycopg_pool"] = None  # importing either fails
import kai_session_checkpoint_policy.cli
import kai_session_checkpoint_policy.persistence
import kai_session_checkpoint_policy.pytest_plugin
try:
    import kai_session_checkpoint_policy.persistence.postgres.store
except ImportError as refused:
    print("refused:", refused.name)
"""


def test_only_the_postgres_store_needs_the_postgres_driver() -> None:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_DRIVER], capture_output=True, text=True, check=True
    )

    assert result.stdout == "refused: psycopg\n"


def test_the_package_has_a_version_and_the_command_shows_it() -> None:
    from importlib.metadata import version

    assert package.__version__ == version("kai-session-checkpoint-policy")
    shown = subprocess.run(
        [sys.executable, "-m", "kai_session_checkpoint_policy", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout == f"kai-checkpoint {package.__version__}\n"


LOADED_BY_THE_POLICY = """
import sys
before = set(sys.modules)
import kai_session_checkpoint_policy.policy
print(" ".join(sorted(m for m in set(sys.modules) - before if m.startswith("kai_session"))))
"""


def test_loading_the_policy_imports_only_the_contract() -> None:
    """The policy's entry point loads the contract it reads, not the host nor a backend."""
    loaded = subprocess.run(
        [sys.executable, "-c", LOADED_BY_THE_POLICY], capture_output=True, text=True, check=True
    ).stdout.split()
    assert loaded == [
        "kai_session_checkpoint_policy",
        "kai_session_checkpoint_policy.cancellation",
        "kai_session_checkpoint_policy.contract",
        "kai_session_checkpoint_policy.hookspecs",
        "kai_session_checkpoint_policy.policy",
        "kai_session_checkpoint_policy.results",
    ]
