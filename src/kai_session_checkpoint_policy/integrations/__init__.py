"""Integrations with agent frameworks; each module is a host of the contract (optional extras)."""
