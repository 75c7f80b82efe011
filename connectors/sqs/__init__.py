"""Amazon SQS: sends to a FIFO queue (or a queue URL template), grouped by the group key."""

from connectors.sqs.config import SqsConnector
from core.registry import ConnectorSpec

CONNECTOR = ConnectorSpec(config=SqsConnector, sink="connectors.sqs.sink:make_sink")
