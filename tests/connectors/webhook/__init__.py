"""The webhook connector's test kit: an HTTP receiver on loopback (receiver.py)."""

from tests.connectors import Kit
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver

KIT = Kit(server=Receiver, fixture="webhook_receiver", harness=WebhookHarness)
