"""Model adapters for real endpoints, each in a module of its own with its own extra.

``openai_compat``
    OpenAI-compatible chat completions, streamed (``pip install
    'kai-session-checkpoint-policy[openai]'``).

Nothing is imported here, so that importing this package needs no optional dependency.
"""
