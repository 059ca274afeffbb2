"""The package's walls: who may import whom, read from the source, and the rules' own failures.

Three rules hold for every module of the package: no module imports a private name (or a
private module) of another; the two backends, ``persistence/jsonl/`` and
``persistence/postgres/``, never import each other; and no module-level import closes a cycle.
Each rule is checked by a function that is also run on a small broken package, so that a rule
that can no longer fail is noticed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

import pytest

import kai_session_checkpoint_policy

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

PACKAGE: Final = Path(kai_session_checkpoint_policy.__file__).parent
NAME: Final = "kai_session_checkpoint_policy"


def module_name(path: Path, root: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def read_package(root: Path, package: str) -> dict[str, tuple[ast.Module, bool]]:
    """Every module of the package under *root*: its syntax tree, and whether it is a package."""
    return {
        module_name(path, root, package): (ast.parse(path.read_text()), path.name == "__init__.py")
        for path in sorted(root.rglob("*.py"))
    }


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(
    tree: ast.Module, module: str, is_package: bool, *, top_level_only: bool = False
) -> Iterator[tuple[str, str | None, int]]:
    """Each import of *tree* as (module imported, name taken from it or ``None``, line).

    Relative imports are resolved. With *top_level_only*, only what runs when the module is
    imported: not the imports inside functions, nor those under ``TYPE_CHECKING``.
    """
    base = module.split(".") if is_package else module.split(".")[:-1]

    def visit(nodes: list[ast.stmt]) -> Iterator[tuple[str, str | None, int]]:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name, None, node.lineno
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parent = base[: len(base) - node.level + 1]
                    source = ".".join([*parent, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    yield source, alias.name, node.lineno
            elif isinstance(node, ast.If):
                if not (top_level_only and _type_checking(node)):
                    yield from visit(node.body)
                yield from visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody):
                    yield from visit(block)
                for handler in node.handlers:
                    yield from visit(handler.body)
            elif not top_level_only:
                yield from visit(
                    [child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)]
                )

    return visit(tree.body)


def private_imports(modules: Mapping[str, tuple[ast.Module, bool]], package: str) -> list[str]:
    """Imports of a private name of another module, or of a private module from outside the
    package that holds it (its siblings may use it, as pluggy's modules use ``_hooks``)."""
    found = []
    for module, (tree, is_package) in modules.items():
        for source, name, line in imports(tree, module, is_package):
            if not (source == package or source.startswith(f"{package}.")):
                continue
            target = source if name is None else f"{source}.{name}"
            parts = target.split(".")
            for index, part in enumerate(parts):
                if not part.startswith("_") or part.startswith("__"):
                    continue
                owner = ".".join(parts[:index])
                if ".".join(parts[: index + 1]) in modules:  # a private module of *owner*
                    allowed = module == owner or module.startswith(f"{owner}.")
                else:  # a private name of the module *owner*
                    allowed = module == owner
                if not allowed:
                    found.append(f"{module}, line {line}: imports {target}")
                    break
    return found


def backend_crossings(
    modules: Mapping[str, tuple[ast.Module, bool]], first: str, second: str
) -> list[str]:
    """Imports from the package *first* of anything in *second*, and the other way round."""
    found = []
    for module, (tree, is_package) in modules.items():
        for one, other in ((first, second), (second, first)):
            if module == one or module.startswith(f"{one}."):
                for source, name, line in imports(tree, module, is_package):
                    target = source if name is None else f"{source}.{name}"
                    if target == other or target.startswith(f"{other}."):
                        found.append(f"{module}, line {line}: imports {target}")
    return found


def cycles(modules: Mapping[str, tuple[ast.Module, bool]]) -> list[list[str]]:
    """The cycles of imports that run when a module is imported (each once, as a path)."""
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for module, (tree, is_package) in modules.items():
        for source, name, _ in imports(tree, module, is_package, top_level_only=True):
            for target in (source, f"{source}.{name}"):
                if target in modules and target != module:
                    graph[module].add(target)
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def walk(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append([*cycle, target])
            elif target not in state:
                walk(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            walk(module, [module])
    return found


# -- the package as it is -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> dict[str, tuple[ast.Module, bool]]:
    return read_package(PACKAGE, NAME)


def test_no_module_imports_a_private_name_of_another(
    package: dict[str, tuple[ast.Module, bool]],
) -> None:
    assert private_imports(package, NAME) == []


def test_the_two_backends_never_import_each_other(
    package: dict[str, tuple[ast.Module, bool]],
) -> None:
    jsonl, postgres = f"{NAME}.persistence.jsonl", f"{NAME}.persistence.postgres"
    assert {jsonl, postgres} <= set(package)
    assert backend_crossings(package, jsonl, postgres) == []


def test_no_import_runs_in_a_cycle(package: dict[str, tuple[ast.Module, bool]]) -> None:
    assert cycles(package) == []


# -- the rules on a broken package ----------------------------------------------------------------

BROKEN: Final = {
    "__init__.py": "",
    "a.py": "from .b import _secret\nfrom .inner._hidden import thing\n",
    "b.py": "from .a import thing\n_secret = 1\n",
    "inner/__init__.py": "from ._hidden import thing\n",
    "inner/_hidden.py": "thing = 1\n",
    "inner/user.py": "from . import _hidden\nfrom ._hidden import thing\n",
    "c.py": "import typing\nif typing.TYPE_CHECKING:\n    from .d import x\n",
    "d.py": "from .c import y\ndef f():\n    from .c import z\n",
    "store/__init__.py": "",
    "store/jsonl/__init__.py": "",
    "store/jsonl/backend.py": "from ..postgres import store\n",
    "store/postgres/__init__.py": "",
    "store/postgres/store.py": "def f():\n    from ...store.jsonl.backend import Thing\n",
}


@pytest.fixture
def broken(tmp_path: Path) -> dict[str, tuple[ast.Module, bool]]:
    for name, text in BROKEN.items():
        path = tmp_path / "broken" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return read_package(tmp_path / "broken", "broken")


def test_the_private_rule_catches_a_private_name_and_a_private_module_from_outside(
    broken: dict[str, tuple[ast.Module, bool]],
) -> None:
    assert private_imports(broken, "broken") == [
        "broken.a, line 1: imports broken.b._secret",
        "broken.a, line 2: imports broken.inner._hidden.thing",
    ]


def test_the_backend_rule_catches_an_import_either_way_even_inside_a_function(
    broken: dict[str, tuple[ast.Module, bool]],
) -> None:
    assert backend_crossings(broken, "broken.store.jsonl", "broken.store.postgres") == [
        "broken.store.jsonl.backend, line 1: imports broken.store.postgres.store",
        "broken.store.postgres.store, line 2: imports broken.store.jsonl.backend.Thing",
    ]


def test_the_cycle_rule_catches_a_cycle_of_top_level_imports_only(
    broken: dict[str, tuple[ast.Module, bool]],
) -> None:
    # a and b import each other when imported; c and d only under TYPE_CHECKING or lazily.
    assert cycles(broken) == [["broken.a", "broken.b", "broken.a"]]


# -- what an entry point loads --------------------------------------------------------------------

ENTRY_POINT_MODULES: Final = {
    "kai_session_checkpoint_policy.policy": 6,
    "kai_session_checkpoint_policy.invariant": 4,
    "kai_session_checkpoint_policy.persistence.jsonl.plugin": 7,
    "kai_session_checkpoint_policy.persistence.postgres.plugin": 7,
}
"""The most modules of the package that importing each ``kai`` entry point may load."""


def test_every_kai_entry_point_is_counted() -> None:
    from importlib.metadata import entry_points

    assert {entry.value for entry in entry_points(group="kai")} == set(ENTRY_POINT_MODULES)


@pytest.mark.parametrize("entry_point", sorted(ENTRY_POINT_MODULES))
def test_importing_an_entry_point_loads_few_modules_of_the_package(entry_point: str) -> None:
    script = (
        "import sys\n"
        f"import {entry_point}\n"
        f"print('\\n'.join(m for m in sys.modules if m.startswith('{NAME}')))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    assert entry_point in loaded
    assert len(loaded) <= ENTRY_POINT_MODULES[entry_point], loaded
    assert not any(".postgres" in module for module in loaded if "jsonl" in entry_point)
    assert not any(".jsonl" in module for module in loaded if "postgres" in entry_point)
