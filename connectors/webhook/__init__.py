"""Webhooks: POSTs signed JSON batches to an HTTP endpoint."""

from connectors.webhook.config import WebhookConnector
from core.registry import ConnectorSpec

CONNECTOR = ConnectorSpec(config=WebhookConnector, sink="connectors.webhook.sink:make_sink")
