"""Hypothesis strategies shared by the reliability suites.

:func:`workloads` draws what the live process does: one or two sessions running concurrently,
each a sequence of agent turns (scripted steps with text chunks and ``read``/``write``/
``nested`` tool calls), bursts of concurrent explicit flushes and direct appends, under a
batch window that is either tiny (background batches interleave with checkpoints) or longer
than the run (only flushes write).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hypothesis import strategies as st

from .crash_child import Action, Append, Flush, SessionPlan, Step, Workload

if TYPE_CHECKING:
    from kai_session_checkpoint_policy import JSON

__all__ = ["json_values", "lossy_values", "session_ids", "workloads"]

TOOLS = ("read", "write", "nested")

chunk_texts = st.text(
    st.characters(codec="utf-8") | st.sampled_from('\n"\\{}'),
    max_size=12,
)


@st.composite
def _turn(draw: st.DrawFn, session_id: str, calls: list[int]) -> tuple[Step, ...]:
    """One turn: steps that call tools, then a step that only answers."""
    steps: list[Step] = []
    for _ in range(draw(st.integers(0, 2))):
        names = draw(st.lists(st.sampled_from(TOOLS), min_size=1, max_size=4))
        ids = []
        for name in names:
            calls[0] += 1
            ids.append((f"{session_id}-c{calls[0]}", name))
        steps.append(Step(tuple(draw(st.lists(chunk_texts, max_size=3))), tuple(ids)))
    steps.append(Step(tuple(draw(st.lists(chunk_texts, max_size=3)))))
    return tuple(steps)


@st.composite
def _plan(draw: st.DrawFn, session_id: str) -> SessionPlan:
    calls = [0]
    actions: list[Action] = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("turn", "turn", "flush", "append")))
        if kind == "turn":
            actions.append(draw(_turn(session_id, calls)))
        elif kind == "flush":
            actions.append(Flush(draw(st.integers(1, 3))))
        else:
            actions.append(Append(draw(st.integers(1, 4))))
    return SessionPlan(session_id, tuple(actions))


@st.composite
def workloads(draw: st.DrawFn, *, max_sessions: int = 2) -> Workload:
    count = draw(st.integers(1, max_sessions))
    plans = tuple(draw(_plan(f"s{index}")) for index in range(count))
    window = draw(st.sampled_from((0.001, 0.005, 3600.0)))
    return Workload(plans, window)


def session_ids() -> st.SearchStrategy[str]:
    """Any id a caller might pass: separators, dots, NUL, surrogates, non-ASCII."""
    pieces = st.characters() | st.sampled_from(["/", "\\", ".", "..", "../", "\0", "~", ":"])
    return st.lists(pieces, min_size=1, max_size=24).map("".join)


json_values: st.SearchStrategy[JSON] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)
"""Values that JSON carries unchanged."""


def lossy_values() -> st.SearchStrategy[object]:
    """Values JSON cannot carry unchanged, each nested somewhere in an otherwise fine object."""
    bad: st.SearchStrategy[object] = st.one_of(
        st.just(math.nan),
        st.just(math.inf),
        st.just(-math.inf),
        st.binary(max_size=4),
        st.tuples(st.integers()),
        st.frozensets(st.integers(), max_size=2),
        st.builds(object),
        st.dictionaries(st.integers() | st.booleans() | st.none(), st.integers(), min_size=1),
    )
    return st.recursive(
        bad,
        lambda inner: (
            st.lists(inner, min_size=1, max_size=2).map(list)
            | st.dictionaries(st.text(max_size=4), inner, min_size=1, max_size=2)
        ),
        max_leaves=3,
    )
