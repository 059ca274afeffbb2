"""Tests of the persistence backends (``kai_session_checkpoint_policy.persistence``)."""
