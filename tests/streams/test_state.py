"""The worker's table store: what reaches the state changelog. Pure (a stand-in for the Faust table's
local data and its changelog's name), no broker."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson

from rewardflow.core.config import JSON_OPTS, EncodedStore
from rewardflow_streams.state import TableStore


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes, int | None]] = []

    def send(self, topic: str, value: bytes | None, key: bytes, partition: int | None = None) -> None:
        self.records.append((topic, value, key, partition))


def table() -> Any:
    app = SimpleNamespace(serializers=SimpleNamespace(dumps_key=lambda key_type, key, serializer: key.encode()))
    return SimpleNamespace(data={}, app=app, key_type=str, key_serializer="raw",
                           changelog_topic=SimpleNamespace(get_topic_name=lambda: "rf-changelog"))


def test_a_value_whose_bytes_the_table_holds_already_sends_no_changelog_record() -> None:
    sent = Sent()
    store = TableStore(table(), sent)  # type: ignore[arg-type]
    store.partition = 3
    big = {"seen": [f"event-{i}" for i in range(20_000)]}
    data = orjson.dumps(big, option=JSON_OPTS)
    store.put_json("s:a", big, data)
    again = {"seen": list(big["seen"])}  # a record refused or a duplicate leaves the state as it was
    store.put_json("s:a", again, orjson.dumps(again, option=JSON_OPTS))
    assert store.get("s:a") is again and store.decodes == 0  # read back without decoding the bytes again
    store.put_json("s:a", {"seen": []}, orjson.dumps({"seen": []}, option=JSON_OPTS))
    store.delete("s:a")
    store.send_queued()
    assert [(key, value is not None and len(value)) for _, value, key, _ in sent.records] == [
        (b"s:a", len(data)), (b"s:a", len(b'{"seen":[]}')), (b"s:a", False)]
    assert store.get("s:a") is None


def test_the_replay_store_counts_what_the_workers_table_sends() -> None:
    store = EncodedStore()
    value = {"turns": {"r1": {"n": 1}}}
    data = orjson.dumps(value, option=JSON_OPTS)
    store.put_json("s:a", value, data)
    again = {"turns": {"r1": {"n": 1}}}
    store.put_json("s:a", again, orjson.dumps(again, option=JSON_OPTS))  # equal bytes, encoded anew
    assert (store.records, store.written) == (1, len(data)) and store.get("s:a") is again
