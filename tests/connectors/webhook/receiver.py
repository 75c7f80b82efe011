"""A real HTTP receiver for webhook tests: a threaded server on loopback that keeps what each
path was sent and can be told to refuse, fail, stall or limit sizes, per path.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import orjson

from connectors.webhook.sink import signature


@dataclass
class Hook:
    """One path's behaviour and what it took (2xx answers only)."""

    secret: str | None = None
    only: list[str] | None = None  # collections it takes; a body with others gets 422
    max_bytes: int | None = None  # bodies over it get 413
    fail_next: int = 0  # answer this many requests 500
    stall_next: int = 0  # leave this many requests unanswered for `stall` seconds
    stall: float = 0.0
    taken: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # of each taken: the path after the hook's
    requests: int = 0
    bad_signatures: int = 0


class Receiver:
    def __init__(self) -> None:
        self.hooks: dict[str, Hook] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                status = receiver.handle(self.path, dict(self.headers.items()), body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def handle(self, path: str, headers: dict[str, str], body: bytes) -> int:
        with self.lock:
            hook, below = self.hooks.get(path), ""
            if hook is None:  # a path under a hook's (a route step's)
                base = next((p for p in self.hooks if path.startswith(p + "/")), None)
                if base is None:
                    return 404
                hook, below = self.hooks[base], path[len(base) + 1 :]
            hook.requests += 1
            stall = hook.stall if hook.stall_next > 0 else 0.0
            hook.stall_next = max(0, hook.stall_next - 1)
            if hook.fail_next > 0:
                hook.fail_next -= 1
                return 500
        if stall:
            time.sleep(stall)  # the sender gives up first; nothing is taken
            return 504
        with self.lock:
            if hook.secret is not None:
                lower = {k.lower(): v for k, v in headers.items()}
                expected = signature(hook.secret.encode(), lower.get("webhook-timestamp", ""), body)
                if lower.get("webhook-signature") != expected:
                    hook.bad_signatures += 1
                    return 401
            if hook.max_bytes is not None and len(body) > hook.max_bytes:
                return 413
            data = orjson.loads(body)["data"]
            if hook.only is not None and any(
                m["metadata"]["collection_id"] not in hook.only for m in data
            ):
                return 422
            hook.taken.extend(data)
            hook.paths.extend([below] * len(data))
            return 200

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
