"""Tests of the reference host (``kai_session_checkpoint_policy.host``)."""
