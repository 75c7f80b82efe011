"""What the Consume API and HTTP ingest refuse, said in the domain's words.

Raised by the consume engine (core/api/consume.py), ingest (core/sources/http.py) and the
routes; the API turns each kind into its HTTP status in one place (core/api/refusals.py), so
none of these modules knows HTTP. ``str(e)`` is the reason a client is told.
"""

from __future__ import annotations


class Refusal(Exception):
    """A request Weir refuses; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Invalid(Refusal):
    """A request value outside what is allowed (a batch size, a token Weir did not issue)."""


class InvalidField(Refusal):
    """A field of a request body that names what cannot be (a source not in the config);
    ``loc`` is where in the request, as validation errors say it."""

    def __init__(self, reason: str, loc: tuple[str, ...]) -> None:
        super().__init__(reason)
        self.loc = loc


class NotFound(Refusal):
    """No consumer or source of that name."""


class Conflict(Refusal):
    """The request contradicts what exists (a name taken, a consumer the config declares)."""


class Busy(Refusal):
    """Too many requests wait already (a consumer's ``max_waiting``)."""
