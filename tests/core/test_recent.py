"""Recent: the most recently put values, bounded in number and in bytes."""

from __future__ import annotations

import random

from rewardflow.core.recent import Recent


def test_the_least_recently_put_go_first_over_the_count() -> None:
    r: Recent[str] = Recent(2)
    for k in "abc":
        r.put(k, k.upper(), 1)
    assert (r.get("a"), r.get("b"), r.get("c"), len(r), r.bytes) == (None, "B", "C", 2, 2)
    r.put("b", "B2", 1)  # put again: the most recent now
    r.put("d", "D", 1)
    assert (r.get("c"), r.get("b"), r.get("d")) == (None, "B2", "D")


def test_over_the_bytes_the_oldest_go_and_the_newest_stays_whatever_its_size() -> None:
    r: Recent[str] = Recent(100, max_bytes=10)
    for k, size in (("a", 4), ("b", 4), ("c", 4)):
        r.put(k, k, size)
    assert (r.get("a"), r.bytes) == (None, 8)
    r.put("big", "big", 50)
    assert (len(r), r.bytes, r.get("big")) == (1, 50, "big")
    assert r.pop("big") == "big" and (len(r), r.bytes) == (0, 0)
    assert r.pop("big") is None
    r.put("a", "a", 3)
    r.clear()
    assert (len(r), r.bytes, r.get("a")) == (0, 0, None)


def test_the_bytes_are_the_sizes_of_what_is_kept_through_any_sequence_of_calls() -> None:
    rng = random.Random(3)
    r: Recent[int] = Recent(rng.randint(1, 8), max_bytes=40)
    model: dict[str, int] = {}  # what should be kept: key -> size, least recent first
    for step in range(3_000):
        key, op = f"k{rng.randint(0, 12)}", rng.random()
        if op < 0.7:
            size = rng.randint(0, 25)
            r.put(key, step, size)
            model.pop(key, None)
            model[key] = size
            while len(model) > r.size or (sum(model.values()) > 40 and len(model) > 1):
                del model[next(iter(model))]
        elif op < 0.95:
            assert (r.pop(key) is None) == (model.pop(key, None) is None)
        else:
            r.clear()
            model.clear()
        assert r.bytes == sum(model.values()) and len(r) == len(model)
        assert all(r.get(k) is not None for k in model)
