"""What aiokafka's fetcher holds for a partition, for the stall watch's log lines, and the one
remedy that reaches into it: closing a connection whose fetch is never answered.

A worker's raw partition can stall with Faust's side in order (read offset, fetch set, flow): the
cause then lies in the Kafka client underneath. :func:`client_state` says what that client holds
for the partition: fetched records not yet taken (from which offset), whether it is paused, its
fetch position, whether the fetcher's background routine still runs, and each fetch request in
flight: the partitions and offsets it asked for, whether it belongs to the current assignment, and
the chain of awaits it is suspended in (down to the future it waits on).

Contract: :func:`client_state` is read-only. It reads private fields of aiokafka (0.14) from
Faust's event loop while the consumer's own thread runs, so a value can be a moment old; it is a
diagnosis, never a decision. :func:`close_unanswered_fetches` changes one thing, on the consumer's
own loop: it closes connections. Neither raises: with another aiokafka, or a consumer that is not
aiokafka's, they return ''.
"""

from __future__ import annotations

from typing import Any

from aiokafka.client import ConnectionGroup

_MAX_AWAITS = 12


def client_state(consumer: Any, tp: Any) -> str:
    """``"; client: buffered from 614, paused no, position 614, fetcher running, in flight [1],
    pending …, held [...], connections …"`` for Faust's ``consumer`` and ``tp``, or '' when it
    cannot be read."""
    try:
        client = consumer._thread._consumer
        fetcher = client._fetcher
        assignment = client._subscription.subscription.assignment
        state = assignment.state_value(tp)
        held = fetcher._records.get(tp)
        records = getattr(held, "_partition_records", None) if held is not None else None
        buffered = ("none" if held is None else
                    f"from {records.next_fetch_offset}" if records is not None else "spent")
        task = fetcher._fetch_task
        routine = "cancelled" if task.cancelled() else "ended" if task.done() else "running"
        position = state.position if state.has_valid_position else "?"
        pending = "; ".join(_request(t, assignment) for t in list(fetcher._pending_tasks)) or "none"
        others = sorted(_short(t) for t in list(fetcher._records))
        conns = "; ".join(_connection(key, conn) for key, conn in list(client._client._conns.items())
                          if key[0] in fetcher._in_flight) or "none"
        return (f"; client: buffered {buffered}, paused {'yes' if state.paused else 'no'}, position {position}, "
                f"fetcher {routine}, in flight {sorted(fetcher._in_flight)}, pending {pending}, held {others}, "
                f"connections {conns}")
    except Exception:  # noqa: BLE001 - another aiokafka, or not one: say nothing
        return ""


def close_unanswered_fetches(consumer: Any) -> str:
    """Close each fetch connection (aiokafka's default group) to a node with a fetch in flight that
    still awaits an answer: ``"node 1"``, or '' when there is none or the client cannot be read.

    Why: aiokafka waits for a fetch's answer up to its request timeout (Faust's
    ``broker_request_timeout``, 90 s), longer than the stall watch. A fetch a broker never answers
    (seen once on a connection opened as the broker came back from a restart) holds every partition
    of that node for the whole of it. Closed, the request fails at once with a connection error and
    the fetcher asks again on a new connection after its retry backoff; other requests on the
    connection fail the same way and are retried by their callers. The close is scheduled on the
    consumer thread's loop (the connection belongs to it) and has happened or is about to when this
    returns; the group coordinator's connection is left alone.
    """
    try:
        thread = consumer._thread
        client = thread._consumer
        in_flight = set(client._fetcher._in_flight)
        stuck = [(key, conn) for key, conn in list(client._client._conns.items())
                 if key[0] in in_flight and key[1] == ConnectionGroup.DEFAULT and conn.connected() and len(conn._requests)]
        loop = thread.thread_loop
        for _, conn in stuck:
            loop.call_soon_threadsafe(_close, conn)
    except Exception:  # noqa: BLE001 - another aiokafka, or not one: nothing to close
        return ""
    return ", ".join(f"node {key[0]}" for key, _ in stuck)


def _close(conn: Any) -> None:
    """Close ``conn`` as aiokafka closes one whose request timed out (so the client refreshes its metadata)."""
    from aiokafka.conn import CloseReason

    conn.close(reason=CloseReason.CONNECTION_TIMEOUT)


def _short(tp: Any) -> str:
    """``changelog-1`` for ``<app>.worker-join-state-changelog`` partition 1: the topic's last dotted part."""
    return f"{tp.topic.rsplit('.', 1)[-1]}-{tp.partition}"


def _request(task: Any, assignment: Any) -> str:
    """One pending fetcher task: the partitions and offsets it asked for, whether its assignment is the
    current one, and the awaits it is suspended in."""
    coro = task.get_coro()
    frame = getattr(coro, "cr_frame", None)
    local = frame.f_locals if frame is not None else {}
    request = local.get("request")
    asked = [f"{topic.rsplit('.', 1)[-1]}:" + ",".join(f"{p}@{offset}" for p, offset, *_ in parts)
             for topic, parts in getattr(request, "topics", None) or []]
    current = "current" if local.get("assignment") is assignment else "older assignment"
    return f"[{' '.join(asked)}] {current}, awaiting {awaits(task)}"


def _connection(key: Any, conn: Any) -> str:
    """``node 1 (group 0): connected, reader running, awaiting 2 answers (FetchRequest_v4, …)``: a
    connection of the nodes with a fetch in flight, and the requests on it still without an answer
    (a broker answers a connection's requests in order)."""
    task = conn._read_task
    reader = "none" if task is None else "ended" if task.done() else "running"
    names = [type(request).__name__ for _, request, _ in list(conn._requests)]
    return (f"node {key[0]} (group {int(key[1])}): {'connected' if conn.connected() else 'not connected'}, "
            f"reader {reader}, awaiting {len(names)} answers ({', '.join(names)})")


def awaits(task: Any) -> str:
    """``f:747 > g:478 > <Future pending …>``: each coroutine of ``task``'s await chain with its line,
    then the future the task is suspended on (asyncio's ``Task._fut_waiter``), when it is."""
    steps: list[str] = []
    node: Any = task.get_coro()
    while node is not None and len(steps) < _MAX_AWAITS:
        frame = getattr(node, "cr_frame", None) or getattr(node, "gi_frame", None)
        if frame is None and not hasattr(node, "cr_await") and not hasattr(node, "gi_yieldfrom"):
            break  # an awaitable that is not a coroutine: the future below names it
        steps.append(f"{getattr(node, '__qualname__', type(node).__name__)}:{frame.f_lineno if frame else '?'}")
        node = getattr(node, "cr_await", None) or getattr(node, "gi_yieldfrom", None)
    waiter = getattr(task, "_fut_waiter", None)
    if waiter is not None:
        steps.append(repr(waiter)[:160])
    return " > ".join(steps)
