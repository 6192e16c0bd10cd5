"""JoinConfig from settings, the decoded-value cache of stores that keep encoded bytes, and what the encoded store counts."""

from __future__ import annotations

import orjson

from rewardflow.core.config import DecodedCache, EncodedStore, JoinConfig
from rewardflow.settings import Settings


def test_the_state_cache_is_split_over_the_partitions_with_a_floor() -> None:
    assert JoinConfig.from_settings(Settings(worker_state_cache=16_384, partitions=4)).state_cache == 4_096
    assert JoinConfig.from_settings(Settings(worker_state_cache=0, partitions=4)).state_cache == 64


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


def test_encoded_store_counts_what_a_changelog_would_carry() -> None:
    store = EncodedStore(check=True)
    store.put("a", {"k": 1})
    store.put_json("b", [1, 2], b"[1,2]")
    store.delete("a")
    store.delete("missing")  # nothing stored: nothing to send
    assert (store.records, store.written) == (3, len(b'{"k":1}') + len(b"[1,2]"))
    assert store.items() == [("b", [1, 2])]
