"""Clients that hold a server's connections: a byte now and then, never a whole request."""

from __future__ import annotations

import socket
import time


def trickle(sockets: list[socket.socket], start: bytes, seconds: float, every: float = 0.4,
            drip: bytes = b"a") -> list[socket.socket]:
    """Send ``start`` on each socket, then ``drip`` on each every ``every`` seconds (within any idle timeout)
    until the server has closed them all or ``seconds`` passed; returns those still open."""
    for sock in sockets:
        sock.sendall(start)
    still_open, began = sockets, time.monotonic()
    while still_open and time.monotonic() - began < seconds:
        time.sleep(every)
        for sock in still_open:
            try:
                sock.sendall(drip)
            except OSError:
                pass
        still_open = [sock for sock in still_open if not closed_now(sock)]
    return still_open


def closed_now(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (what it answered before that, a 401 say, is read and dropped)."""
    s.setblocking(False)
    try:
        while s.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        s.setblocking(True)


