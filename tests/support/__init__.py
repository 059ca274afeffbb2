"""What the tests share and are not tests: helpers, data, and the programs run as children.

The child programs (``crash_child.py``, ``long_run_child.py``, ``slow_fsync_child.py``) run as
scripts, ``python <this folder>/crash_child.py ...``, and import nothing from the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

SUPPORT: Final = Path(__file__).resolve().parent
"""This folder, where the child programs and the data files are."""
