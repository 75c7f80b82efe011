"""A webhook receiver that answers every POST with 401 and a body made of the Authorization
header it got (as receivers that echo a rejected credential do), for the secret-leak tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class EchoReceiver:
    """Answers 401 with ``body(authorization)`` on 127.0.0.1; ``url`` is where it listens."""

    def __init__(self, body: Callable[[str], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                data = body(self.headers.get("Authorization", "")).encode()
                self.send_response(401)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
