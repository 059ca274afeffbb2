"""The code shown in the Markdown docs, kept equal to the example files that the tests run.

A page shows code as an ordinary fenced block, so that it reads the same on a code hosting site
as in the built documentation. An HTML comment right before the block (invisible on both) names
where the code comes from::

    <!-- example: examples/hooks.py pyobject=MemoryMirror -->
    ```python
    class MemoryMirror:
        ...
    ```

``pyobject=NAME`` takes a top-level class or function, ``between=LABEL`` the lines between
``# example: LABEL`` and ``# example: end``, ``from-line=N`` the lines from line N on, and
nothing at all the whole file. Run
``python tests/doc_snippets.py`` to rewrite every block from its file after changing one.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Final

DOCS: Final = Path(__file__).resolve().parent.parent / "docs"

MARKER: Final = re.compile(
    r"^<!-- example: (?P<path>\S+)(?: (?P<kind>pyobject|between|from-line)=(?P<name>\S+))? -->\n"
    r"```(?P<language>[a-z]*)\n(?P<code>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)


def region(path: Path, kind: str | None, name: str | None) -> str:
    """The code a marker names, without the blank lines it ends with (as ``ruff format`` has
    it in a Markdown code block), ending with a newline."""
    return _region(path, kind, name).rstrip("\n") + "\n"


def _region(path: Path, kind: str | None, name: str | None) -> str:
    text = path.read_text()
    if kind is None:
        return text
    lines = text.splitlines(keepends=True)
    if kind == "from-line":
        return "".join(lines[int(name or 1) - 1 :])
    if kind == "between":
        start = lines.index(f"# example: {name}\n") + 1
        end = lines.index("# example: end\n", start)
        return "".join(lines[start:end])
    definitions = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.parse(text).body:
        if isinstance(node, definitions) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            return "".join(lines[first - 1 : node.end_lineno])
    raise LookupError(f"{path} has no top-level {name}")


def rendered(page: Path) -> str:
    """*page* with every marked block replaced by the code its marker names."""

    def replace(match: re.Match[str]) -> str:
        source = page.parent / match["path"]
        code = region(source, match["kind"], match["name"])
        head = match.group(0).split("\n", 1)[0]
        return f"{head}\n```{match['language']}\n{code}```"

    return MARKER.sub(replace, page.read_text())


def sources(page: Path) -> set[Path]:
    """The files whose code *page* shows."""
    return {(page.parent / match["path"]).resolve() for match in MARKER.finditer(page.read_text())}


if __name__ == "__main__":
    for page in sorted(DOCS.glob("*.md")):
        text = rendered(page)
        if text != page.read_text():
            page.write_text(text)
            print(f"rewrote {page.relative_to(DOCS.parent)}", file=sys.stderr)
