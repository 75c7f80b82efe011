"""The API's port while ``weir run`` waits for its store at start (a service started before its
database): ``/health`` answers 200 (the process is up) and every other path 503 naming what it
waits for, so a probe, a container's health check or an operator learns why instead of being
refused. Plain ``http.server``: the supervisor loads no FastAPI. Closed before any worker
starts; the API's worker then serves the port."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from core.api.listen import listen
from core.failures import wait_for_store

if TYPE_CHECKING:
    from core.config.model import WeirConfig


def awaited_store(cfg: WeirConfig, stop: threading.Event) -> bool:
    """:func:`core.failures.wait_for_store` in ``weir run``'s first process: while it waits,
    the API's port answers probes with why."""
    probes = WaitingProbes(*cfg.api.host_port) if cfg.api is not None else None
    try:
        return wait_for_store(cfg, stop, probes.note if probes is not None else None)
    finally:
        if probes is not None:
            probes.close()


class WaitingProbes:
    """Serves the port from the first :meth:`note` of a wait on; a port in use is left to the
    API's start to report."""

    def __init__(self, host: str, port: int) -> None:
        self.address = host, port
        self.reason = ""
        self.server: ThreadingHTTPServer | None = None

    def note(self, reason: str) -> None:
        """What the wait is for now; the port is served from the first one."""
        self.reason = reason
        if self.server is None:
            self._serve()

    def _serve(self) -> None:
        probes = self

        class Answer(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body: dict[str, Any]
                if self.path.split("?", 1)[0] == "/health":
                    code, body = 200, {"status": "up"}
                else:
                    code, body = 503, {"status": "not ready", "checks": {
                        "store": f"waiting: {probes.reason}"}}  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PUT = do_DELETE = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        try:
            sock = listen(*self.address)
        except OSError:
            return  # said by the API's start, once the store answers
        server = ThreadingHTTPServer(self.address, Answer, bind_and_activate=False)
        server.socket.close()
        server.socket = sock
        server.daemon_threads = True
        self.server = server
        threading.Thread(target=server.serve_forever, name="waiting-probes", daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
