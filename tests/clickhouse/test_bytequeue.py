"""The queue a read's stages hand blocks through: bounded in items and in bytes, first in first out."""

from __future__ import annotations

import queue
import threading

import pytest

from rewardflow.clickhouse.bytequeue import ByteQueue


def test_items_and_bytes_both_bound_the_queue_and_an_empty_one_takes_any_item() -> None:
    q = ByteQueue(max_items=3, max_bytes=100)
    q.put("a", 60, timeout=0)
    with pytest.raises(queue.Full):
        q.put("b", 41, timeout=0)  # 101 bytes: no room
    q.put("b", 40, timeout=0)
    with pytest.raises(queue.Full):
        q.put("c", 1, timeout=0)  # full to the byte
    assert q.get(timeout=0) == "a" and q.get(timeout=0) == "b"
    q.put("huge", 1_000, timeout=0)  # alone: an empty queue takes it
    with pytest.raises(queue.Full):
        q.put("d", 1, timeout=0)
    assert q.get_nowait() == "huge"
    for item in "xyz":
        q.put(item, 0, timeout=0)
    with pytest.raises(queue.Full):
        q.put("w", 0, timeout=0)  # three items
    assert [q.get(timeout=0) for _ in range(3)] == ["x", "y", "z"]
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)


def test_a_waiting_put_goes_in_once_a_get_makes_room() -> None:
    q = ByteQueue(max_items=4, max_bytes=10)
    q.put("a", 10, timeout=0)
    done = threading.Event()

    def producer() -> None:
        q.put("b", 10, timeout=5)
        done.set()

    t = threading.Thread(target=producer)
    t.start()
    assert not done.wait(0.1)  # no room until "a" is taken
    assert q.get(timeout=1) == "a"
    assert done.wait(5) and q.get(timeout=1) == "b"
    t.join()
