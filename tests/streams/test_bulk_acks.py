"""The worker's acks of a confirmed batch (:func:`~rewardflow_streams.bulk.ack_all`) against Faust's
own ``Consumer.ack``, one message at a time: Faust's code, run on the fields it reads and writes."""

from __future__ import annotations

import random
import weakref
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

from faust.transport.consumer import Consumer
from intervaltree import IntervalTree
from faust.types import TP
from faust.types.tuples import Message

from rewardflow_streams.bulk import ack_all, ack_part
from rewardflow_streams.gaps import _Refetched

RAW = "raw"
OFF = "no-acks"  # a topic whose acks are off: its messages are marked acked, never counted


def _consumer(committed: dict[TP, int]) -> Any:
    topics = SimpleNamespace(acks_enabled_for=lambda topic: topic != OFF)
    c = SimpleNamespace(app=SimpleNamespace(topics=topics), _acked=defaultdict(list), _acked_index=defaultdict(set),
                        _committed_offset=defaultdict(lambda: None), _unacked_messages=weakref.WeakSet(),
                        _n_acked=0, _waiting_for_ack=None)
    c._committed_offset.update(committed)
    return c


def _messages(rng: random.Random, tps: list[TP]) -> list[Message]:
    out = []
    for tp in tps:
        for offset in sorted(rng.sample(range(60), rng.randint(0, 25))):
            for _ in range(rng.choice((1, 1, 1, 2))):  # now and then the same offset twice (a redelivery)
                out.append(Message(tp.topic, tp.partition, offset, 0.0, 0, [], b"k", b"v", None, tp=tp))
    return out


def _state(c: Any, messages: list[Message]) -> tuple[Any, ...]:
    return (dict(c._acked), dict(c._acked_index), c._n_acked, [m.acked for m in messages])


def test_ack_all_leaves_the_consumer_as_faust_acking_each_message_does() -> None:
    rng = random.Random(7)
    for _ in range(300):
        tps = [TP(RAW, 0), TP(RAW, 1), TP(OFF, 0)][: rng.randint(1, 3)]
        committed = {tp: rng.choice((0, 10, 30)) for tp in tps if rng.random() < 0.7}
        pre = rng.randint(0, 3)  # messages acked before, by an earlier batch
        theirs, ours = _consumer(committed), _consumer(committed)
        faust_msgs = _messages(random.Random(rng.random()), tps)
        if rng.random() < 0.3:  # now and then the partitions' messages interleaved
            rng.shuffle(faust_msgs)
        our_msgs = [Message(m.topic, m.partition, m.offset, 0.0, 0, [], b"k", b"v", None, tp=m.tp) for m in faust_msgs]
        for m in faust_msgs[:pre]:
            Consumer.ack(theirs, m)
        for m in our_msgs[:pre]:
            Consumer.ack(ours, m)
        theirs_new = sum(bool(Consumer.ack(theirs, m)) for m in faust_msgs)
        assert ack_all(ours, our_msgs) == theirs_new
        assert _state(ours, our_msgs) == _state(theirs, faust_msgs)


def test_ack_all_wakes_a_waiter_once_and_counts_nothing_twice() -> None:
    import asyncio

    async def scenario() -> None:
        c = _consumer({TP(RAW, 0): 5})
        c._waiting_for_ack = asyncio.get_running_loop().create_future()
        msgs = [Message(RAW, 0, o, 0.0, 0, [], b"k", b"v", None, tp=TP(RAW, 0)) for o in (3, 5, 6, 6)]
        assert ack_all(c, msgs) == 2  # 3 is below the commit; the second 6 is a redelivery
        assert c._waiting_for_ack.done()
        assert ack_all(c, msgs) == 0
        assert c._acked[TP(RAW, 0)] == [5, 6] and c._n_acked == 2

    asyncio.run(scenario())


def test_a_part_that_ends_inside_a_hole_the_gap_guard_read_is_committed_through_its_last_record() -> None:
    """Offsets 110..119 never reached the worker; the gap guard read them and made them a gap interval.
    The core stopped after 114 for a commit: acking the part lets Faust's commit reach 115, never past the
    refetched records not processed yet; the next fetched record's ack then takes the commit past the hole."""
    tp = TP(RAW, 0)
    c = _consumer({tp: 100})
    c._gap = defaultdict(IntervalTree)
    c._gap[tp].addi(110, 120)
    fetched = [Message(RAW, 0, o, 0.0, 0, [], b"k", b"v", None, tp=tp) for o in range(100, 110)]
    refetched = [_Refetched(tp, o, b"v", [], 1) for o in range(110, 120)]
    ack_all(c, fetched)
    assert _commit(c, tp) == 110  # the fetched part alone: the hole stops the commit
    ack_part(c, [*fetched, *refetched[:5]])
    assert _commit(c, tp) == 115
    ack_all(c, [Message(RAW, 0, 120, 0.0, 0, [], b"k", b"v", None, tp=tp)])
    assert _commit(c, tp) == 121


def _commit(c: Any, tp: TP) -> int:
    """The offset Faust's commit of ``tp`` leaves committed (its own steps on the fields they use)."""
    new = Consumer._new_offset(c, tp)
    if new is not None and Consumer._should_commit(c, tp, new):
        c._committed_offset[tp] = new
    return int(c._committed_offset[tp])
