"""JoinConfig from settings, the decoded-value cache of stores that keep encoded bytes, and what the encoded store counts."""

from __future__ import annotations

import orjson

from rewardflow.core.config import DecodedCache, EncodedStore, JoinConfig
from rewardflow.settings import Settings


def test_the_state_cache_is_split_over_the_partitions_with_a_floor() -> None:
    assert JoinConfig.from_settings(Settings(worker_state_cache=16_384, partitions=4)).state_cache == 4_096
    assert JoinConfig.from_settings(Settings(worker_state_cache=0, partitions=4)).state_cache == 64
    assert JoinConfig.from_settings(Settings(worker_state_cache_mb=128, partitions=4)).state_cache_bytes == 32 << 20
    assert JoinConfig.from_settings(Settings(worker_state_cache_mb=1, partitions=12)).state_cache_bytes == 1 << 20


def test_decoded_cache_returns_the_value_written_while_the_bytes_are_the_same_and_counts_decodes() -> None:
    cache = DecodedCache(2)
    values = {k: {"k": k} for k in "abc"}
    data = {k: orjson.dumps(v) for k, v in values.items()}
    for k in "abc":
        cache.keep(k, data[k], values[k])
    assert cache.read("c", data["c"]) is values["c"] and cache.read("b", data["b"]) is values["b"]
    assert cache.read("a", data["a"]) == values["a"] and cache.read("a", data["a"]) is not values["a"]  # evicted
    assert cache.read("c", orjson.dumps(values["c"])) is not values["c"]  # other bytes (a recovery): decoded
    assert (cache.reads, cache.decodes) == (5, 3)
    cache.drop("b")
    assert cache.read("b", data["b"]) is not values["b"]


def test_decoded_cache_keeps_at_most_its_bytes_of_encodings_the_newest_whatever_its_size() -> None:
    cache = DecodedCache(100, max_bytes=100)
    values = {k: {"k": k * n} for k, n in (("a", 30), ("b", 30), ("c", 30), ("d", 200))}
    data = {k: orjson.dumps(v) for k, v in values.items()}  # 38, 38, 38 and 208 bytes
    for k in "abc":
        cache.keep(k, data[k], values[k])
    assert cache.held_bytes == 76 and cache.read("a", data["a"]) is not values["a"]  # a went for c
    assert cache.read("b", data["b"]) is values["b"] and cache.read("c", data["c"]) is values["c"]
    cache.keep("c", data["c"], values["c"])  # written again: counted once
    assert cache.held_bytes == 76
    cache.keep("d", data["d"], values["d"])  # over the limit alone: kept, and the others go
    assert cache.held_bytes == 208 and cache.read("d", data["d"]) is values["d"]
    assert cache.read("c", data["c"]) is not values["c"]
    cache.drop("d")
    assert cache.held_bytes == 0
    cache.keep("a", data["a"], values["a"])
    cache.clear()
    assert cache.held_bytes == 0 and cache.read("a", data["a"]) is not values["a"]


def test_encoded_store_counts_what_a_changelog_would_carry() -> None:
    store = EncodedStore(check=True)
    store.put("a", {"k": 1})
    store.put_json("b", [1, 2], b"[1,2]")
    store.delete("a")
    store.delete("missing")  # nothing stored: nothing to send
    assert (store.records, store.written) == (3, len(b'{"k":1}') + len(b"[1,2]"))
    assert store.items() == [("b", [1, 2])]
