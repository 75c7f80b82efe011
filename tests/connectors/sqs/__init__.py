"""The SQS connector's test kit: an embedded SQS endpoint (moto's server)."""

from devkit.embedded import EmbeddedSqs
from tests.connectors import Kit
from tests.connectors.sqs.harness import SqsHarness

KIT = Kit(server=EmbeddedSqs, fixture="sqs_server", harness=SqsHarness)
