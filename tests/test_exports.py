"""``__all__`` of the re-exporting packages is sorted and is exactly their public surface."""

from __future__ import annotations

import re
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
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
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
    assert exported - modules == public_names(module)
