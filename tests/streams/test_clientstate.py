"""The stall watch's view of the Kafka client: the await chain of a suspended task, and silence on a
consumer it cannot read. (Its view of a live aiokafka consumer is checked by the stall fault tests.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from rewardflow_streams.clientstate import awaits, client_state


async def _inner(fut: asyncio.Future[None]) -> None:
    await fut


async def _outer(fut: asyncio.Future[None]) -> None:
    await _inner(fut)


def test_awaits_names_each_coroutine_down_to_the_future_it_waits_on() -> None:
    async def main() -> str:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(_outer(fut))
        await asyncio.sleep(0)  # the task runs until it waits on the future
        chain = awaits(task)
        fut.set_result(None)
        await task
        return chain

    chain = asyncio.run(main())
    steps = chain.split(" > ")
    assert [s.split(":")[0] for s in steps[:2]] == ["_outer", "_inner"], chain
    assert all(s.split(":")[1].isdigit() for s in steps[:2]), chain
    assert steps[2].startswith("<Future pending"), chain


def test_awaits_of_a_finished_task_is_its_coroutine_alone() -> None:
    async def main() -> str:
        task = asyncio.create_task(_outer(asyncio.get_running_loop().create_future()))
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return awaits(task)

    assert asyncio.run(main()) == "_outer:?"


def test_a_consumer_that_is_not_aiokafkas_gives_nothing() -> None:
    assert client_state(SimpleNamespace(), ("raw", 0)) == ""
    broken = SimpleNamespace(_thread=SimpleNamespace(_consumer=SimpleNamespace(_fetcher=None)))
    assert client_state(broken, ("raw", 0)) == ""
