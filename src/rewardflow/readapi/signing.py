"""Signed requests at the read endpoint: the ``Authorization`` header parsed, the time checked, the
nonce remembered so a request is taken once.

A reader signs each request with its token (:func:`~rewardflow.clickhouse.remote.request_signature`):
``RF-HMAC-SHA256 id=<token id>,ts=<unix seconds>,nonce=<hex>,sig=<hex>``. The endpoint takes it when
its time is within :data:`WINDOW_S` of the endpoint's clock, its signature is the token's
(:meth:`~rewardflow.readapi.tokens.TokenStore.signed`) and its nonce was not seen within the window:
a copy of a request (kept by a process that relayed it) is refused.

Contract: pure but for the clock and the nonces kept; thread-safe. At most ``max_kept`` nonces a
token are kept (each until its request's time is past the window); a signed request beyond that is
refused (429) until older ones expire, never taken without its replay check. With a
:class:`~rewardflow.readapi.noncelog.NonceLog`, each nonce is written to it before its request is
taken (blocking on that write only), and the nonces it holds are taken as seen at start: a copy is
refused after a restart too. A nonce that cannot be written is refused (503).
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from rewardflow.clickhouse.remote import SIGNED
from rewardflow.readapi.noncelog import NonceLog

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

    def __init__(self, window_s: float = WINDOW_S, max_kept: int = 50_000, log: NonceLog | None = None) -> None:
        self.window_s, self.max_kept, self._log = window_s, max_kept, log
        self._kept: dict[str, OrderedDict[str, float]] = {}  # token id -> nonce -> when it may go (wall clock)
        self._lock = threading.Lock()
        if log is not None:  # the nonces a run before this one took, while their requests could still come
            for token_id, nonce, until in log.load(time.time()):
                self._kept.setdefault(token_id, OrderedDict())[nonce] = until
            log.rewrite(self._entries())

    def _entries(self) -> list[tuple[str, str, float]]:
        return [(t, n, u) for t, kept in self._kept.items() for n, u in kept.items()]

    def skew(self, ts: int) -> float | None:
        """How far ``ts`` is from this clock, seconds, when over the window; None when within it."""
        off = ts - time.time()
        return off if abs(off) > self.window_s else None

    def take(self, token_id: str, nonce: str, ts: int) -> tuple[int, str] | None:
        """Remember ``nonce`` of a request signed with token ``token_id`` at ``ts``; None, or the status and
        reason it is refused with: 401 seen before; 429 the token's ``max_kept`` requests within the window
        (each token has its own count); 503 the nonce log could not be written. A nonce is kept until its request's time is past the window by
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
            until = max(ts, now) + self.window_s
            if self._log is not None:
                try:
                    self._log.append(token_id, nonce, until)
                except OSError as exc:
                    return 503, f"the endpoint cannot record this request's nonce ({exc}); retry later"
            kept[nonce] = until
            for idle in [t for t, k in self._kept.items() if not k and t != token_id]:
                del self._kept[idle]
            if self._log is not None and self._log.due(sum(len(k) for k in self._kept.values())):
                try:
                    self._log.rewrite(self._entries())
                except OSError:
                    pass  # (the file keeps every line; the next due take tries again)
        return None
