"""Loopback TCP ports: is one free, and pick free ones."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from rewardflow.kafka_local.config import HOST

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)
PICK_FROM = 20000  # above the well-known defaults (the local broker's 19092, 8000s, 9000s)


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


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of source ports for outgoing connections (Linux's default if unreadable)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def free_ports(count: int, host: str = HOST) -> list[int]:
    """``count`` consecutive ports, all free now, below the kernel's ephemeral range.

    Outside that range no outgoing connection is given one of them as its source port in
    the moment between this check and a listener's bind: a broker that starts after its
    peers have begun connecting still finds its ports free. The block starts at a random
    port, so concurrent test processes seldom try the same one; ``port_is_free`` checks
    every port. Raises ``OSError`` if no free block is found.
    """
    low = PICK_FROM
    high = min(ephemeral_range()[0], 65536) - count
    if high <= low:
        low, high = 1024, 65536 - count
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(low, high)
        if all(port_is_free(base + i, host) for i in range(count)):
            return [base + i for i in range(count)]
    raise OSError(f"no {count} consecutive free ports found on {host} between {low} and {high + count}")
