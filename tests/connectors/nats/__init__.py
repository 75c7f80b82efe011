"""The NATS JetStream connector's test kit: an embedded nats-server with JetStream."""

from devkit.embedded import EmbeddedNats
from tests.connectors import Kit
from tests.connectors.nats.harness import NatsHarness

KIT = Kit(server=EmbeddedNats, fixture="nats_server", harness=NatsHarness)
