"""The bilingual README pair and its record, ``README.i18n.yaml``.

The record holds the git blob hash of each side (what ``git hash-object FILE`` prints) as of the
last time both sides said the same. A change to either side without bringing the other along
shows as a hash that no longer matches. After updating both, re-record::

    python -m tests.support.readme_pair --write

Without ``--write`` it only checks, and exits 1 if the record is stale.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
RECORD: Final = ROOT / "README.i18n.yaml"
SIDES: Final = ("README.md", "README.zh.md")

_HEADER: Final = """\
# Translation-pair record for the README: the git blob hash (`git hash-object FILE`) of each
# side as of the last time both said the same. Neither side is the original; after changing
# one, bring the other along, then re-record with:
#   python -m tests.support.readme_pair --write
"""


def blob_hash(data: bytes) -> str:
    """The git blob hash of *data*: SHA-1 over ``blob <size>\\0`` and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def current() -> dict[str, str]:
    """The blob hash of each side as it is now."""
    return {side: blob_hash((ROOT / side).read_bytes()) for side in SIDES}


def recorded(text: str | None = None) -> dict[str, str]:
    """The hashes in the record (``name: hash`` lines; comments and blank lines skipped)."""
    text = RECORD.read_text(encoding="utf-8") if text is None else text
    entries: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition(":")
            entries[name.strip()] = value.strip()
    return entries


def render(hashes: dict[str, str]) -> str:
    return _HEADER + "".join(f"{side}: {hashes[side]}\n" for side in SIDES)


def stale_sides() -> list[str]:
    """The sides whose hash differs from the record."""
    record, now = recorded(), current()
    return [side for side in SIDES if record.get(side) != now[side]]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        RECORD.write_text(render(current()), encoding="utf-8")
        return 0
    if argv:
        print("usage: python -m tests.support.readme_pair [--write]", file=sys.stderr)
        return 2
    stale = stale_sides()
    for side in stale:
        print(f"{side} changed since the record; bring the other side along, then --write")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
