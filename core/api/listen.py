"""The API's listening socket: made by the API's worker, and tried by the supervisor before it
starts any worker, so that a port in use ends ``weir run`` before capture makes a slot. Imports
nothing of FastAPI: the supervisor does not load it."""

from __future__ import annotations

import os
import socket

from core.redact import said


def listen(host: str, port: int) -> socket.socket:
    """The API's listening socket, or an error that says who may hold the port."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )[0]
        # Made as asyncio makes its own: with the protocol named, so that the connections it
        # accepts get TCP_NODELAY (asyncio sets it only then). Without it, a response written
        # in two parts waited for the client's delayed ACK: 40 ms a request.
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise _cannot(host, port, e) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise _cannot(host, port, e) from None
    return sock


def _cannot(host: str, port: int, e: OSError) -> OSError:
    why = os.strerror(e.errno) if e.errno else str(e)
    return OSError(
        said(
            "cannot listen on %s:%s: %s; another weir run or another program may hold the "
            "port: stop it, or set api.listen to a free one",
            host,
            port,
            why,
        )
    )
