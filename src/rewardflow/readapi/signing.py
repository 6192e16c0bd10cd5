"""Signed requests at the read endpoint: the ``Authorization`` header parsed, the time checked, the
nonce remembered so a request is taken once.

A reader signs each request with its token (:func:`~rewardflow.clickhouse.remote.request_signature`):
``RF-HMAC-SHA256 id=<token id>,ts=<unix seconds>,nonce=<hex>,sig=<hex>``. The endpoint takes it when
its time is within :data:`WINDOW_S` of the endpoint's clock, its signature is the token's
(:meth:`~rewardflow.readapi.tokens.TokenStore.signed`) and its nonce was not seen within the window:
a copy of a request (kept by a process that relayed it) is refused.

Contract: pure but for the clock and the nonces kept; thread-safe; never blocks. At most
``max_kept`` nonces a token are kept (each until its request's time is past the window); a signed
request beyond that is refused (429) until older ones expire, never taken without its replay check.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from rewardflow.clickhouse.remote import SIGNED

WINDOW_S = 300
"""How far a signed request's time may be from the endpoint's clock, seconds, either way."""

_FIELDS = re.compile(r"^id=([0-9a-f]{12}),ts=([0-9]{1,12}),nonce=([0-9a-f]{16,64}),sig=([0-9a-f]{64})$")


@dataclass(frozen=True)
class Signed:
    """The parts of a signed request's ``Authorization``."""

    token_id: str
    ts: int
    nonce: str
    sig: str


def parse(header: str) -> Signed | None:
    """The signed parts of an ``Authorization`` header of the :data:`~rewardflow.clickhouse.remote.SIGNED`
    scheme, or None when it is not one (another scheme, or malformed)."""
    scheme, _, rest = header.partition(" ")
    if scheme.upper() != SIGNED:
        return None
    match = _FIELDS.match(rest.strip())
    if match is None:
        return None
    return Signed(match.group(1), int(match.group(2)), match.group(3), match.group(4))


class Nonces:
    """The nonces of the signed requests taken within the last two windows, per token."""

    def __init__(self, window_s: float = WINDOW_S, max_kept: int = 50_000) -> None:
        self.window_s, self.max_kept = window_s, max_kept
        self._kept: dict[str, OrderedDict[str, float]] = {}  # token id -> nonce -> when it may go (wall clock)
        self._lock = threading.Lock()

    def skew(self, ts: int) -> float | None:
        """How far ``ts`` is from this clock, seconds, when over the window; None when within it."""
        off = ts - time.time()
        return off if abs(off) > self.window_s else None

    def take(self, token_id: str, nonce: str, ts: int) -> tuple[int, str] | None:
        """Remember ``nonce`` of a request signed with token ``token_id`` at ``ts``; None, or the status and
        reason it is refused with: 401 seen before; 429 the token's ``max_kept`` requests within the window
        (each token has its own count). A nonce is kept until its request's time is past the window by
        the wall clock, the clock :meth:`skew` judges by, so no clock step makes a copy acceptable again."""
        now = time.time()
        with self._lock:
            kept = self._kept.setdefault(token_id, OrderedDict())
            while kept:
                first, until = next(iter(kept.items()))
                if until > now:
                    break
                del kept[first]
            if nonce in kept:
                return 401, "this signed request was taken before (a copy is refused)"
            if len(kept) >= self.max_kept:
                return 429, f"this token signed {len(kept)} requests within {2 * self.window_s:g} s; retry later"
            kept[nonce] = max(ts, now) + self.window_s
            for idle in [t for t, k in self._kept.items() if not k and t != token_id]:
                del self._kept[idle]
        return None
