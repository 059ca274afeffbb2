"""pytest fixtures for host authors: a host with the checkpoint policy, and test doubles."""

from __future__ import annotations
