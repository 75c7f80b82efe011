"""A config as the management API shows it and takes it back (docs/configuration.md
“Secrets”): secrets masked by field and by shape (core/redact.py's rules), and a mask sent back
where it was shown keeps the secret it stands for."""

from __future__ import annotations

from typing import Any

from core.redact import SECRET_MASK, credential, redact_value, shaped_mask


def shown(value: Any, key: str = "") -> Any:
    """JSON-like ``value`` (a model's ``model_dump(mode="json")``) as an answer may show it:
    secrets masked by field (SecretStr fields are by the dump already; strings under a
    credential ``key``), URL passwords by shape, every other value as it is."""
    if isinstance(value, str):
        return SECRET_MASK if credential(key) else redact_value(value)
    if isinstance(value, dict):
        return {k: shown(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [shown(v, key) for v in value]
    return value


def unmasked(new: Any, was_shown: Any, was: Any) -> Any:
    """``new`` (a config sent back to change one) with each value that is the masked one it
    was shown (``was_shown``, from :func:`shown`) put back to what it is (``was``), so that
    sending back what was read keeps the secrets instead of storing their masks."""
    if isinstance(new, dict) and isinstance(was_shown, dict) and isinstance(was, dict):
        return {k: unmasked(v, was_shown.get(k), was.get(k)) if k in was else v
                for k, v in new.items()}  # fmt: skip
    if isinstance(new, list) and not isinstance(was_shown, list):  # one value made a list
        was_shown, was = [was_shown], [was]
    elif isinstance(was_shown, list) and isinstance(was, list) and not isinstance(new, list):
        return unmasked([new], was_shown, was)[0]  # a list made one of its values
    if isinstance(new, list) and isinstance(was_shown, list) and isinstance(was, list):
        # a cluster's URLs, filters, steps: an item as it was shown is the one it was shown
        # for, kept in place or moved (when no other was shown alike); else by place
        pairs = list(zip(was_shown, was, strict=False))
        return [unmasked(v, *_shown_as(v, i, pairs)) for i, v in enumerate(new)]
    if isinstance(new, str) and new == was_shown and was is not None and new != was:
        return was
    return new


def _shown_as(item: Any, place: int, pairs: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    """The (shown, stored) pair of a list that ``item``, at ``place`` in the list sent back,
    was shown as: the one at its place if alike, else the only one alike, else the one at its
    place (or none)."""
    alike = [i for i, (shown, _) in enumerate(pairs) if shown == item]
    if place in alike or len(alike) != 1:
        return pairs[place] if place < len(pairs) else (None, None)
    return pairs[alike[0]]


def masks_in(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Where a mask is left in JSON-like ``value`` (a secret the sender never had), or None:
    a field's ``**********``, or a ``***`` where a rule by shape puts one (a URL's password or
    token, a ``token=`` value), also inside a value changed around it."""
    if isinstance(value, str):
        return path if SECRET_MASK in value or shaped_mask(value) else None
    if isinstance(value, (dict, list)):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            if (found := masks_in(v, (*path, str(k)))) is not None:
                return found
    return None
