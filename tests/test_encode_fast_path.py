"""Events are encoded by calling the json module's C encoder directly: same text, same errors."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypothesis import example, given

from kai_session_checkpoint_policy import events

from .strategies import json_values, lossy_values

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
