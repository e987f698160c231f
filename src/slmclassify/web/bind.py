"""The listening socket of both web apps, bound before the model loads (a taken port fails at once)
and handed to uvicorn as `server.run(sockets=[sock])`."""

from __future__ import annotations

import socket


def bind(host: str, port: int, *, backlog: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: a free one; IPv6 when `host` holds a colon).

    Raises the `OSError` of a failed bind after closing the socket: the caller knows which of its
    settings to name in the error it raises."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(backlog)
    return sock
