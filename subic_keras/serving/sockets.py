"""Listening sockets for `subic serve`: the standard library only, so that
the command line opens its port (and says a busy one) before TensorFlow
loads."""

from __future__ import annotations

import ipaddress
import socket


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port` (`port` 0: a free port).

    Raises:
        OSError: the address cannot be listened on (in use, not this
            machine's, or not an address), naming it.
    """
    try:
        (family, kind, proto, _, address), *_ = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        sock = socket.socket(family, kind, proto)
    except OSError as error:
        raise OSError(f"cannot listen on {host!r}: {error.strerror or error}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as error:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(f"cannot listen on {where}: {error.strerror or error}") from None
    return sock


def url(sock: socket.socket) -> str:
    """The address a listening socket answers at, with the port it bound."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def is_wildcard(host: str) -> bool:
    """Whether `host` means every interface (`0.0.0.0`, `::`)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False
