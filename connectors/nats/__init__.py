"""NATS JetStream: publishes to subjects ``sequin-{stream}.{namespace}...`` (docs/design.md
“Subjects and record ids”); ``weir nats setup`` creates the streams."""

from connectors.nats.config import NatsConnector
from core.registry import ConnectorSpec

CONNECTOR = ConnectorSpec(
    config=NatsConnector,
    sink="connectors.nats.sink:make_sink",
    setup="connectors.nats.setup:ensure_streams",
    setup_help="create the JetStream streams the connectors publish into",
)
