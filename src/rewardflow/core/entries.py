"""A JSON object's encoding kept with where each of its entries ends. Pure.

A session's ``done`` and ``held`` maps are rewritten whole at every state write, grow by
appended entries and lose entries at a prune, often moving them from one map to the other. An
:class:`Entries` lets each entry be encoded once, when it is added: dropping entries takes the
bytes of the others, and an entry moving to another map is framed from its bytes, never encoded
again. Only the entries' end offsets are kept beside the bytes (one int an entry).

:func:`grown` and :func:`reusable` keep such an encoding across state writes; :func:`encoded_map`
and :func:`from_key` do the same for ``seen``, whose values hold no string, so an entry's start is
found in the bytes instead of kept.

Contract: ``body`` is always ``orjson.dumps(m, option=JSON_OPTS)`` of the map ``m`` it was made
from, whose entries are ``orjson.dumps(key) + b":" + orjson.dumps(value, option=JSON_OPTS)``
in the map's order (orjson writes an object with no whitespace, and a ``str`` key as it writes
the string). Whoever holds an :class:`Entries` must drop it when the map changes otherwise than
by the calls here (a value replaced in place, say).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Any

import orjson

from rewardflow.core.config import JSON_OPTS


class Entries:
    """The encoding of ``source`` (a dict) when it held ``n`` entries: ``body``, and ``ends[i]``,
    the offset in ``body`` just past entry ``i`` (entry ``i`` starts one byte past the end of the
    one before it, or at 1)."""

    __slots__ = ("source", "n", "body", "ends")

    def __init__(self, source: dict[str, Any], body: bytes, ends: list[int]) -> None:
        self.source = source
        self.n = len(ends)
        self.body = body
        self.ends = ends

    def of(self, source: dict[str, Any]) -> bool:
        """Whether this is the encoding of ``source`` as it is now."""
        return self.source is source and self.n == len(source)

    def part(self, i: int) -> bytes:
        """Entry ``i``'s bytes, ``"<key>":<value>``."""
        ends = self.ends
        return self.body[ends[i - 1] + 1 if i else 1:ends[i]]

    def extended(self, source: dict[str, Any], items: Iterable[tuple[str, Any]]) -> Entries:
        """This encoding with the entries of ``items`` (key, JSON form) appended, for ``source``
        (the map grown by them). This one is changed and returned: it must not be used for its
        old map afterwards."""
        return self.with_parts(source, [entry(k, v) for k, v in items])

    def with_parts(self, source: dict[str, Any], parts: list[bytes]) -> Entries:
        """This encoding with already encoded entries appended (see :meth:`extended`)."""
        if not parts:
            self.source = source
            return self
        ends = self.ends
        at = ends[-1] if ends else 0
        for p in parts:
            at += 1 + len(p)
            ends.append(at)
        self.body = self.body[:-1] + (b"," if self.n else b"") + b",".join(parts) + b"}"
        self.source, self.n = source, len(ends)
        return self


def encode(source: dict[str, Any], items: Iterable[tuple[str, Any]]) -> Entries:
    """The encoding of ``source``, whose entries are ``items`` (key, JSON form), in order."""
    return joined(source, [entry(k, v) for k, v in items])


def joined(source: dict[str, Any], parts: list[bytes]) -> Entries:
    """The encoding of ``source``, whose entries' bytes are ``parts``, in order."""
    ends, at = [], 0
    for p in parts:
        at += 1 + len(p)
        ends.append(at)
    return Entries(source, b"{" + b",".join(parts) + b"}", ends)


def reframed(key: str, entry: bytes, prefix: bytes) -> bytes:
    """An entry for ``key`` whose value is ``[<prefix><the value of entry>]``: ``entry`` is the
    ``"<key>":<value>`` bytes of ``key`` in another map, and ``prefix`` the bytes of the list's
    first items, each followed by a comma (``b"12,"``)."""
    head = orjson.dumps(key)
    return head + b":[" + prefix + entry[len(head) + 1:] + b"]"


def entry(key: str, value: Any) -> bytes:
    """The bytes of one entry, ``"<key>":<value>``, as a map encodes it."""
    return orjson.dumps(key) + b":" + orjson.dumps(value, option=JSON_OPTS)


def reusable(last: Entries | None, source: dict[str, Any]) -> Entries | None:
    """``last`` when it encodes ``source`` or a prefix of it (``source`` grew by appended entries
    since), else None; an empty ``source`` has its encoding made."""
    if last is not None and last.source is source and last.n <= len(source):
        return last
    return joined(source, []) if not source else None


def grown(last: Entries | None, source: dict[str, Any], forms: dict[str, Any]) -> Entries:
    """The encoding of ``source`` whose JSON form is ``forms`` (same keys, same order), from ``last``:
    only the entries appended since are encoded."""
    enc = reusable(last, source)
    if enc is None:
        return encode(source, forms.items())
    if enc.n == len(source):
        return enc
    return enc.extended(source, islice(forms.items(), enc.n, None))


def from_key(encoded: bytes, key: str) -> bytes | None:
    """``encoded`` (a JSON object whose values hold no string and no object, as ``seen``'s lists of
    ints) less its entries before ``key``'s: ``'{"a":[1],"b":[2]}'`` from ``"b"`` is ``'{"b":[2]}'``;
    None when ``key`` is not a later entry of it.

    The cut is found, not measured: inside a JSON string a quote is always escaped, and these values
    hold no string, so a comma followed by a quote starts an entry; ``,"<key>":`` then starts
    ``key``'s entry and no other (keys are unique)."""
    at = encoded.find(b"," + orjson.dumps(key) + b":")
    return None if at < 0 else b"{" + encoded[at + 1:]


def encoded_map(last: tuple[Any, int, bytes] | None, source: dict[str, Any], values: dict[str, Any]) -> tuple[Any, int, bytes]:
    """The encoding of ``values`` (``source``'s JSON form, same keys in the same order), from ``last``."""
    n = len(source)
    if last is None or last[0] is not source or last[1] > n:
        return source, n, orjson.dumps(values, option=JSON_OPTS)
    if last[1] == n:
        return last
    tail = orjson.dumps(dict(islice(values.items(), last[1], None)), option=JSON_OPTS)
    return source, n, (last[2][:-1] + b"," + tail[1:]) if last[1] else tail
