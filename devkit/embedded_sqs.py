"""moto's SQS server for tests and benches, with one route of its own: ``GET
/_weir/queues/{name}`` lists what a queue holds (body, group id, dedup id) without consuming
it, which SQS itself cannot do. Run as ``python -m devkit.embedded_sqs PORT``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import moto.sqs.models
from moto.core.utils import unix_time
from moto.server import DomainDispatcherApplication, create_backend_app  # type: ignore[attr-defined]
from moto.sqs.models import sqs_backends
from werkzeug.serving import run_simple

from devkit.embedded import EmbeddedSqs

PEEK = "/_weir/queues/"


def _now_millis(dt: Any = None) -> float:
    """moto's clock without its datetime round trips: every send computes the queue's
    attributes, which asks each message held whether it is visible, so with moto's own clock
    a queue of a few thousand messages takes seconds per request.
    """
    return time.time() * 1000.0 if dt is None else float(unix_time(dt)) * 1000.0


moto.sqs.models.unix_time_millis = _now_millis  # type: ignore[attr-defined]

_attributes = moto.sqs.models.Queue.attributes.fget  # type: ignore[attr-defined]
_request = threading.local()  # the attributes read in the request a server thread serves


def _attributes_once(queue: Any) -> dict[str, Any]:
    """moto's queue attributes, read once per request: moto reads them six times for each
    message sent (for ContentBasedDeduplication alone), and each read counts the messages
    held, so with the clock above a send into a queue of n messages still scanned it 18 times
    (a few thousand messages held: under 20 messages a second, re-sends included).
    """
    memo: dict[int, dict[str, Any]] | None = getattr(_request, "memo", None)
    if memo is None:
        return _attributes(queue)  # type: ignore[no-any-return]
    if id(queue) not in memo:
        memo[id(queue)] = _attributes(queue)
    return memo[id(queue)]


moto.sqs.models.Queue.attributes = property(_attributes_once)  # type: ignore[assignment]


def peek(name: str) -> list[dict[str, Any]]:
    queue = sqs_backends[EmbeddedSqs.account][EmbeddedSqs.region].queues[name]
    return [{"body": m.body, "group_id": m.group_id, "dedup_id": m.deduplication_id}
            for m in list(queue._messages)]  # fmt: skip


def app(moto: Any) -> Callable[..., Iterable[bytes]]:
    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if not path.startswith(PEEK):
            _request.memo = {}
            try:
                return moto(environ, start_response)  # type: ignore[no-any-return]
            finally:
                _request.memo = None
        try:
            body, status = json.dumps(peek(path[len(PEEK) :])).encode(), "200 OK"
        except KeyError:
            body, status = b"[]", "404 Not Found"
        start_response(status, [("Content-Type", "application/json")])
        return [body]

    return wsgi


if __name__ == "__main__":
    run_simple("127.0.0.1", int(sys.argv[1]), app(DomainDispatcherApplication(create_backend_app)),
               threaded=True)  # fmt: skip
