"""The demo agent, and the story ``kai-checkpoint demo`` tells with it.

The agent (:mod:`.agent`) is the smallest one in which a crash matters: a scripted model asks
for one ``send_payment`` call, the tool body moves money, and the model then answers with text.
:mod:`.reporter` prints each event and, at each checkpoint, what the policy made durable, asking
the policy where it checkpoints; :mod:`.story` tells the whole story, a normal turn, the same
turn killed inside the tool and recovered, and the same crash without the policy.
"""

from .agent import (
    CALL_ID,
    DEMO_LEASE_TTL,
    MARKERS,
    MODEL,
    PAYMENT,
    PAYMENT_PARAMETERS,
    PROMPT,
    PROVIDER,
    TOOL_NAME,
    DemoError,
    HangAt,
    ScriptedModel,
    agent_command,
    demo_host,
    make_payment_tool,
    run_agent,
    wait_for_marker,
    write_marker,
)
from .reporter import CheckpointReporter
from .story import run_demo

__all__ = [
    "CALL_ID",
    "DEMO_LEASE_TTL",
    "MARKERS",
    "MODEL",
    "PAYMENT",
    "PAYMENT_PARAMETERS",
    "PROMPT",
    "PROVIDER",
    "TOOL_NAME",
    "CheckpointReporter",
    "DemoError",
    "HangAt",
    "ScriptedModel",
    "agent_command",
    "demo_host",
    "make_payment_tool",
    "run_agent",
    "run_demo",
    "wait_for_marker",
    "write_marker",
]
