"""Checking the options a backend is configured with, as arguments or as host options."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["check_seconds", "seconds_option"]


def check_seconds(name: str, value: float, *, positive: bool = True) -> float:
    """*value* as a float, if it is a finite number of seconds (above 0 if *positive*).

    :raises ValueError: naming *name* and the value, if it is not.
    """
    checked: object = value
    if (
        isinstance(checked, bool)
        or not isinstance(checked, (int, float))
        or not math.isfinite(checked)
        or checked < 0
        or (positive and checked == 0)
    ):
        qualifier = "a positive" if positive else "a non-negative"
        raise ValueError(f"{name} must be {qualifier} number of seconds, not {checked!r}")
    return float(checked)


def seconds_option(options: Mapping[str, object], option: str, default: float) -> float:
    """The host option *option*, a number of seconds, or *default* if it is not set.

    :raises TypeError: if the option is set to something other than a number.
    """
    value = options.get(option, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"host option {option!r} must be seconds, not {value!r}")
    return value
