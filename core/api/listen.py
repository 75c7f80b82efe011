"""The API's listening socket: made by the API's worker, and tried by the supervisor before it
starts any worker, so that a port in use ends ``weir run`` before capture makes a slot. Imports
nothing of FastAPI: the supervisor does not load it."""

from __future__ import annotations

import os
import socket


def listen(host: str, port: int) -> socket.socket:
    """The API's listening socket, or an error that says who may hold the port."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        why = os.strerror(e.errno) if e.errno else str(e)
        raise OSError(
            f"cannot listen on {host}:{port}: {why}; another weir run or another program may "
            "hold the port: stop it, or set api.listen to a free one"
        ) from None
