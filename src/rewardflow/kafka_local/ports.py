"""Loopback TCP ports: is one free, and pick free ones."""

from __future__ import annotations

import socket

from rewardflow.kafka_local.config import HOST


def port_is_free(port: int, host: str = HOST) -> bool:
    """True if a listening socket could bind ``host:port`` right now.

    The answer can be stale a moment later; the broker's own bind is the
    final word (it exits, and :class:`BrokerStartError` reports the log).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` distinct ports the kernel reports free (all bound at once, then released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
