"""The contract suite runs once per broker; each harness starts from a session server."""

from __future__ import annotations

import pytest

from core.embedded import EmbeddedNats
from tests.helpers.brokers import NatsHarness


@pytest.fixture(params=["nats"])
def broker(request: pytest.FixtureRequest, nats_server: EmbeddedNats) -> NatsHarness:
    return NatsHarness(nats_server)
