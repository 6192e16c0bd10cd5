"""Deterministic ids of the output records (their shapes are in :mod:`rewardflow.core.rows`).

Every record carries an id computed only from its inputs (:func:`stable_id`), so a redelivered
input produces a byte-identical id and the sink deduplicates it.

Contract: pure, no I/O.
"""

from __future__ import annotations

import hashlib


_BLAKE = hashlib.blake2b(digest_size=16)  # copied per id: cheaper than a constructor with keywords
_FMT = tuple("%s\x1f" * n for n in range(16))  # "%s" formats a part exactly as str() does


def stable_id(*parts: object) -> str:
    """128-bit hex id of the parts; identical inputs give identical ids.

    The digest is blake2b-128 of each ``str(part)``, UTF-8, followed by ``\\x1f``.
    """
    n = len(parts)
    return id_of_joined((_FMT[n] if n < 16 else "%s\x1f" * n) % parts)


def id_of_joined(text: str) -> str:
    """:func:`stable_id` of parts already joined as ``str(part) + "\\x1f"`` each (hot paths build the text
    with one f-string instead of the generic formatting)."""
    h = _BLAKE.copy()
    h.update(text.encode())
    return h.hexdigest()
