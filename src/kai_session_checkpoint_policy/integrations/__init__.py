"""Integrations with agent frameworks: each a host of the contract, in a module of its own.

``kai_session_checkpoint_policy.integrations.pydantic_ai``
    Pydantic AI: a capability that records a run in a session log, with the checkpoints of the
    policy (extra ``pydantic-ai``).
``kai_session_checkpoint_policy.integrations.openai_agents``
    The OpenAI Agents SDK: a ``Session`` that is the session log, and the ``RunHooks`` that
    checkpoint it (extra ``openai-agents``).

Nothing is imported here: a framework is imported only with the module of its integration.
"""

__all__: list[str] = []
