"""Ingestion keys: created, listed and revoked in ClickHouse (``ingest_keys``); checked by the edge.

A key is ``rfk_<key_id>_<secret>``: ``key_id`` is 12 hex characters, public (lists, logs); the
secret is 32 random bytes, url-safe base64. Only ``sha256`` of the whole key is stored. A key
belongs to one org: every event sent with it is that org's.

:class:`KeyCache` is the edge's view: it reloads the table every ``refresh_s`` seconds (a revoked
key stops working within that), and compares hashes in constant time.

Contract: :class:`IngestKeys` methods block on one ClickHouse round trip each and raise the
driver's errors; :meth:`KeyCache.org_of` never blocks on ClickHouse (a background refresh keeps
it current; a failed refresh keeps the previous view and is logged); :meth:`KeyCache.refresh_after_miss`
does, sharing reloads among misses and starting one at most twice a second.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]

log = logging.getLogger(__name__)

PREFIX = "rfk_"
_SHAPE = re.compile(r"^rfk_([0-9a-f]{12})_[A-Za-z0-9_\-]{20,}$")
LATEST_SQL = ("SELECT key_id, org_id, name, secret_sha256, revoked, toString(changed_at) AS changed_at FROM ingest_keys "
           "ORDER BY _seq DESC LIMIT 1 BY key_id")


@dataclass(frozen=True, slots=True)
class KeyInfo:
    key_id: str
    org_id: str
    name: str
    revoked: bool
    changed_at: str


def new_key() -> tuple[str, str]:
    """A fresh ``(key_id, secret)``."""
    key_id = secrets.token_hex(6)
    return key_id, f"{PREFIX}{key_id}_{secrets.token_urlsafe(32)}"


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def key_id_of(secret: str) -> str | None:
    """The key id of a well-formed secret, else None."""
    m = _SHAPE.match(secret)
    return m.group(1) if m else None


class IngestKeys:
    """Administration of the ``ingest_keys`` table through a ClickHouse client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def create(self, org_id: str, name: str = "") -> tuple[KeyInfo, str]:
        """Store a new key of ``org_id``; returns it and its secret (shown once, never stored)."""
        if not org_id or len(org_id) > 128:
            raise ValueError("org: 1 to 128 characters")
        key_id, secret = new_key()
        self._write(key_id, org_id, name, digest(secret), 0)
        return KeyInfo(key_id, org_id, name, False, ""), secret

    def revoke(self, key_id: str) -> KeyInfo | None:
        """Revoke ``key_id``; None if there is no such key."""
        current = next((k for k in self._rows() if k["key_id"] == key_id), None)
        if current is None:
            return None
        self._write(key_id, current["org_id"], current["name"], current["secret_sha256"], 1)
        return KeyInfo(key_id, current["org_id"], current["name"], True, "")

    def all(self) -> list[KeyInfo]:
        return sorted((KeyInfo(r["key_id"], r["org_id"], r["name"], bool(r["revoked"]), r["changed_at"])
                       for r in self._rows()), key=lambda k: (k.org_id, k.key_id))

    def table(self) -> dict[str, tuple[str, str]]:
        """Active keys: ``key_id -> (secret_sha256, org_id)``."""
        return {r["key_id"]: (r["secret_sha256"], r["org_id"]) for r in self._rows() if not r["revoked"]}

    def _rows(self) -> list[Row]:
        return list(self.client.query(LATEST_SQL).named_results())

    def _write(self, key_id: str, org_id: str, name: str, sha: str, revoked: int) -> None:
        self.client.insert("ingest_keys", [[key_id, org_id, name, sha, revoked]],
                           column_names=["key_id", "org_id", "name", "secret_sha256", "revoked"])


class KeyCache:
    """The edge's view of the active keys, reloaded by ``load`` every ``refresh_s`` seconds."""

    def __init__(self, load: Callable[[], dict[str, tuple[str, str]]], refresh_s: float = 2.0) -> None:
        self._load, self.refresh_s = load, refresh_s
        self._keys: dict[str, tuple[str, str]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._miss_lock = threading.Lock()
        # misses wait for reloads on a thread of their own: a flood of unknown keys queues here, not in
        # the server's shared thread pool
        self.miss_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rewardflow-keys-miss")
        self.loaded_at = 0.0

    def refresh(self) -> None:
        """Reload now (raises what ``load`` raises)."""
        started = time.monotonic()
        self._keys = self._load()
        self.loaded_at = started

    def refresh_after_miss(self, missed_at: float, min_interval_s: float = 0.5) -> None:
        """Make sure the view was loaded after ``missed_at`` (when a key was not found), so a key created a
        moment ago works at once. Misses share reloads, which start at most every ``min_interval_s``:
        unknown keys cannot make the edge reload faster. Blocks up to that long; logs a failure."""
        with self._miss_lock:
            if self.loaded_at >= missed_at:
                return  # a reload that began after the miss has finished meanwhile
            time.sleep(max(0.0, self.loaded_at + min_interval_s - time.monotonic()))
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the last good view stays
                log.warning("ingest keys not refreshed: %s", exc)

    def start(self) -> KeyCache:
        """Load once (raising if that fails), then keep reloading in a daemon thread."""
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="rewardflow-keys", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.miss_executor.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep serving the last good view; say why
                log.warning("ingest keys not refreshed (serving the view of %.0f s ago): %s",
                            time.monotonic() - self.loaded_at, exc)

    def org_of(self, secret: str) -> tuple[str, str] | None:
        """``(key_id, org_id)`` of an active key, else None."""
        key_id = key_id_of(secret)
        entry = self._keys.get(key_id) if key_id else None
        if entry is None or key_id is None or not hmac.compare_digest(entry[0], digest(secret)):
            return None
        return key_id, entry[1]
