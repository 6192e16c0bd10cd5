"""The stall watch's view of the Kafka client: the await chain of a suspended task, and silence on a
consumer it cannot read (its view of a live aiokafka consumer is checked by the stall fault tests);
and its one remedy there, closing a fetch connection whose request is never answered, on real
aiokafka connections to a server that reads and never answers."""

from __future__ import annotations

import asyncio
import concurrent.futures
import struct
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from rewardflow_streams.clientstate import awaits, client_state, close_unanswered_fetches


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


def _silent_client(in_flight: set[int]) -> tuple[Any, Any, Any, Any, Any]:
    """A running loop in a thread with a TCP server that answers a connection's version lookup and
    nothing after it, and three real aiokafka
    connections to it: node 1's fetch connection, node 1's coordinator connection, node 2's fetch
    connection. Returns the loop, a stand-in of Faust's consumer holding them, and the three."""
    from aiokafka.client import ConnectionGroup
    from aiokafka.conn import create_conn
    from aiokafka.protocol.admin import ApiVersionResponse_v0

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="consumer-thread", daemon=True).start()

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the first request of a connection is the client's version lookup: answered; then nothing is
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        correlation = (await reader.readexactly(size))[4:8]
        body = correlation + ApiVersionResponse_v0(error_code=0, api_versions=[(3, 0, 1)]).encode()
        writer.write(struct.pack(">i", len(body)) + body)
        while await reader.read(65536):
            pass

    async def connect() -> tuple[Any, ...]:
        server = await asyncio.start_server(swallow, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        return tuple([await create_conn("127.0.0.1", port, request_timeout_ms=60_000) for _ in range(3)])

    fetch1, coord1, fetch2 = asyncio.run_coroutine_threadsafe(connect(), loop).result(10)
    conns = {(1, ConnectionGroup.DEFAULT): fetch1, (1, ConnectionGroup.COORDINATION): coord1,
             (2, ConnectionGroup.DEFAULT): fetch2}
    client = SimpleNamespace(_fetcher=SimpleNamespace(_in_flight=in_flight), _client=SimpleNamespace(_conns=conns))
    consumer = SimpleNamespace(_thread=SimpleNamespace(thread_loop=loop, _consumer=client))
    return loop, consumer, fetch1, coord1, fetch2


def _ask(loop: Any, conn: Any) -> concurrent.futures.Future[Any]:
    """Send a metadata request on ``conn`` from its loop; the future is its answer (never, from the silent server)."""
    from aiokafka.protocol.metadata import MetadataRequest

    async def send() -> Any:
        return await conn.send(MetadataRequest([]))

    return asyncio.run_coroutine_threadsafe(send(), loop)


def test_a_fetch_connection_still_awaiting_its_answer_is_closed_and_its_request_fails_at_once() -> None:
    from aiokafka.errors import KafkaConnectionError

    loop, consumer, fetch1, coord1, fetch2 = _silent_client(in_flight={1, 2})
    try:
        answers = [_ask(loop, conn) for conn in (fetch1, coord1)]
        time.sleep(0.3)
        assert not any(a.done() for a in answers)  # the server never answers
        assert close_unanswered_fetches(consumer) == "node 1"  # node 2's connection awaits nothing
        with pytest.raises(KafkaConnectionError):
            answers[0].result(5)
        assert not fetch1.connected()
        assert coord1.connected() and fetch2.connected()  # the coordinator's, and one with nothing asked
        assert not answers[1].done()
    finally:
        for conn in (coord1, fetch2):
            loop.call_soon_threadsafe(conn.close)
        loop.call_soon_threadsafe(loop.stop)


def test_a_node_without_a_fetch_in_flight_keeps_its_connection() -> None:
    loop, consumer, fetch1, coord1, fetch2 = _silent_client(in_flight=set())
    try:
        answer = _ask(loop, fetch1)
        time.sleep(0.3)
        assert close_unanswered_fetches(consumer) == ""
        time.sleep(0.2)
        assert fetch1.connected() and not answer.done()
    finally:
        for conn in (fetch1, coord1, fetch2):
            loop.call_soon_threadsafe(conn.close)
        loop.call_soon_threadsafe(loop.stop)


def test_closing_on_a_consumer_that_is_not_aiokafkas_closes_nothing() -> None:
    assert close_unanswered_fetches(SimpleNamespace()) == ""
    assert close_unanswered_fetches(SimpleNamespace(_thread=SimpleNamespace(_consumer=None))) == ""
