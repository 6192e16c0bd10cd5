"""A minimal HTTP client of the edge for tests and the demo's simulated editors (stdlib only)."""

from __future__ import annotations

import gzip
import time
import urllib.error
import urllib.request
from typing import Any

import orjson


def post_events(url: str, key: str | None, events: list[dict[str, Any]], *, sent_at: int | None = None,
                gzipped: bool = False, body: bytes | None = None, timeout: float = 30.0) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST /v1/events; returns (status, JSON body, headers)."""
    data = body if body is not None else orjson.dumps(
        {"sent_at": int(time.time() * 1000) if sent_at is None else sent_at, "events": events})
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if gzipped:
        data, headers["Content-Encoding"] = gzip.compress(data), "gzip"
    req = urllib.request.Request(f"{url}/v1/events", data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, orjson.loads(resp.read()), {k.lower(): v for k, v in resp.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read() or b"{}"), {k.lower(): v for k, v in exc.headers.items()}
