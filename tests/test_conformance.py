"""The conformance kit, run against the reference host and against a host of another author."""

from __future__ import annotations

import pytest

from kai_session_checkpoint_policy.conformance import HostConformance, HostFactory

from .support.third_party_host import host_under_test


class TestTheReferenceHost(HostConformance):
    """The kit's default factory opens the reference host."""


class TestAThirdPartyHost(HostConformance):
    @pytest.fixture
    def kai_host_factory(self) -> HostFactory:
        return host_under_test
