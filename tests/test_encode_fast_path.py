"""Events are encoded by calling the json module's C encoder directly: same text, same errors."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from hypothesis import example, given
from hypothesis import strategies as st

from kai_session_checkpoint_policy import events

from .support.strategies import json_values, lossy_values

if TYPE_CHECKING:
    from collections.abc import Callable

circular: dict[str, object] = {"a": [1]}
circular["self"] = circular


def _outcome(encode: Callable[[object], str], value: object) -> object:
    try:
        return encode(value)
    except (TypeError, ValueError) as error:
        return type(error), str(error)


@given(json_values | lossy_values())
@example(circular)
@example({"a": {"b": [1.5, -0.0, 1e300, "\u00e9\ud800\n"]}, "": None})
def test_the_direct_encoder_encodes_exactly_as_json_encoder(value: object) -> None:
    assert events._make_c_encoder is not None  # else both sides are the same call
    assert _outcome(events._encode, value) == _outcome(events._encoder.encode, value)


def _checked(check: Callable[[object], tuple[object, str]], value: object) -> object:
    try:
        copy, encoded = check(value)
    except events.EventDataError as error:
        return type(error), str(error)
    assert json.loads(encoded) == copy
    return copy


@given(st.dictionaries(st.text(max_size=3), json_values | lossy_values(), max_size=3))
@example({"big": 2**64, "huge": 10**400, "float": 1e16, "tiny": 5e-324, "neg": -0.0})
@example({"nan": float("nan"), "tuple": (1,), "key": {1: 2}})
@example({"lone": "\ud800", "text": "\u00e9\x00\x1f", "deep": [[[[[[[[]]]]]]]]})
def test_append_refuses_exactly_what_the_standard_library_refuses(value: object) -> None:
    """The compiled codec checks most data; what it accepts, the standard library's round
    trip accepts too, with the same copy, and what it refuses is refused with the same error."""
    compiled = _checked(lambda data: events.encode_data("x", data), value)
    standard = _checked(lambda data: events._checked("x", data, False), value)
    assert compiled == standard
