"""``python -m kai_session_checkpoint_policy``: the same as the ``kai-checkpoint`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
