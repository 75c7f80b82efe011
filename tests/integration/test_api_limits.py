"""Request bodies beyond ``api.max_body_bytes`` get 413 before they are read into memory
(docs/design.md “Guarantees”), whether they declare their length or come in chunks.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx

from devkit.server import free_port
from tests.helpers.api import TOKEN, api_serving

LIMIT = 64 * 1024
TOO_LARGE = {"detail": f"the request body is larger than api.max_body_bytes ({LIMIT} bytes)"}


def _record(size: int) -> bytes:
    one = {"collection_id": "stripe:sub", "record_id": "1", "version": 1, "data": {"x": "y" * size}}
    return json.dumps({"records": [one]}).encode()


def test_bodies_beyond_the_limit_get_413(table: str) -> None:
    port = free_port()
    api = {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN], "max_body_bytes": "64KiB"}
    with api_serving(table, port, api=api) as client:
        ok = client.post("/v1/sources/stripe/records", content=_record(LIMIT - 200),
                         headers={"Content-Type": "application/json"})  # fmt: skip
        assert ok.status_code == 200, ok.text

        # A declared length beyond the limit (a 150 MB record): answered at once, unread.
        for method, path in (("POST", "/v1/sources/stripe/records"),
                             ("GET", "/v1/http-consumers")):  # fmt: skip
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}"
                          f"\r\nContent-Type: application/json\r\nContent-Length: 157286400\r\n"
                          "\r\n".encode())  # fmt: skip
                head, _, body = _response(s).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 413 "), head
            assert json.loads(body) == TOO_LARGE

        # Chunks without a declared length: counted as they are read.
        def chunks() -> Iterator[bytes]:
            body = _record(4 * LIMIT)
            for i in range(0, len(body), 4096):
                yield body[i : i + 4096]

        r = client.post("/v1/sources/stripe/records", content=chunks(),
                        headers={"Content-Type": "application/json"})  # fmt: skip
        assert r.request.headers["Transfer-Encoding"] == "chunked"
        assert (r.status_code, r.json()) == (413, TOO_LARGE)
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200


def _response(s: socket.socket) -> bytes:
    """One response: its head, and a body as long as its Content-Length."""
    got = b""
    while b"\r\n\r\n" not in got or len(got.partition(b"\r\n\r\n")[2]) < _length(got):
        chunk = s.recv(65536)
        assert chunk, f"connection closed after {got!r}"
        got += chunk
    return got


def _length(response: bytes) -> int:
    for line in response.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            return int(value)
    return 0
