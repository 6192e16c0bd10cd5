"""Tick records: the watermarks workers write to idle raw partitions, signed so no client can forge one.

A tick is a raw record with header ``rf-format: tick`` and the value
``{"wm": <event-time ms>, "mac": "<hex>"}``. The MAC is HMAC-SHA256, under the
key the workers of a deployment share, of the raw topic's name and the
watermark; a tick of another deployment or with a changed watermark fails it.

Contract: pure (no I/O). :func:`read_tick` says what a tick record carries and
whether it is authentic; it never raises. Verification depends only on the
record and the key, so a replay of the raw topic decides exactly as the stream
did.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

import orjson

TICK = "tick"
TICK_HEADERS = [("rf-format", TICK.encode())]


def tick_mac(key: bytes, topic: str, wm: int) -> str:
    """The hex MAC of a tick carrying ``wm`` on ``topic``."""
    return hmac.new(key, f"{topic}\x00{wm}".encode(), hashlib.sha256).hexdigest()


def signed_tick(key: bytes, topic: str, wm: int) -> bytes:
    """The value of a tick record carrying ``wm`` on ``topic``, signed with ``key``."""
    return orjson.dumps({"wm": wm, "mac": tick_mac(key, topic, wm)})


@dataclass(frozen=True, slots=True)
class TickRead:
    """What a tick record carries: the watermark, or the dead-letter code and reason that refuse it."""

    wm: int | None
    code: str = ""
    reason: str = ""


def read_tick(value: bytes | None, topic: str, key: bytes | None) -> TickRead:
    """The watermark of a tick record; ``key`` None accepts unsigned ticks (replays of trusted data).

    A value that is not ``{"wm": <int>, ...}`` is ``bad_tick``; a missing or wrong MAC is
    ``forged_tick``. Never raises.
    """
    try:
        obj = orjson.loads(value or b"")
    except orjson.JSONDecodeError:
        obj = None
    wm = obj.get("wm") if isinstance(obj, dict) else None
    if not isinstance(wm, int) or isinstance(wm, bool):
        return TickRead(None, "bad_tick", 'a tick value must be {"wm": <int ms>, "mac": <hex>}')
    if key is None:
        return TickRead(wm)
    mac = obj.get("mac") if isinstance(obj, dict) else None
    # compared as bytes: compare_digest raises on a str that is not ASCII, and a client writes the mac
    if not isinstance(mac, str) or not hmac.compare_digest(mac.encode("utf-8", "replace"),
                                                           tick_mac(key, topic, wm).encode()):
        return TickRead(None, "forged_tick",
                        "a tick must be signed by a worker of this deployment (the rf-format: tick header is reserved)")
    return TickRead(wm)
