"""A step function for config/examples/transforms.yaml: called with the message's parts, it
returns the message to send (a dict) or None to drop it."""


def without_secrets(action, record, changes, metadata):
    if record is None:
        return {"action": action, "record": record, "changes": changes, "metadata": metadata}
    kept = {k: v for k, v in record.items() if not k.endswith(("_token", "_hash"))}
    return {"action": action, "record": kept, "changes": changes, "metadata": metadata}
