"""Up to N inserts in flight, in the background: partitions in parallel, each partition strictly in order.

Parsing an insert is single-threaded in ClickHouse, and the sink's own thread
has Kafka to read meanwhile, so inserts run on a pool of ``in_flight`` threads
(Snuba keeps two in flight too) while the caller goes on consuming. Order and
commit semantics are unchanged: the batches of one partition form a *chain*
written one after the other by one thread; a chain stops at its first failure
and reports what it wrote and what is left. The caller keeps at most one chain
per partition in flight (so a partition's batches are never reordered) and
commits only the written prefixes, after the chain's future is done.

Threads: one pool of ``in_flight`` threads, each with its own connection
(chDB and HTTP clients serialise calls per connection). :meth:`submit` never
blocks; the returned future raises only for programming errors (ClickHouse
failures are in :attr:`ChainResult.error`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from clickhouse_connect.driver.client import Client

from rewardflow.sink.batching import Batch
from rewardflow.clickhouse.errors import ClickHouseUnavailable, clean_message, is_driver_error
from rewardflow.sink.writer import BatchWriter, Fault


@dataclass
class ChainResult:
    """What one partition's chain did: written (batch, dead letters) in order, the rest, the error."""

    written: list[tuple[Batch, int]] = field(default_factory=list)
    remaining: list[Batch] = field(default_factory=list)
    error: ClickHouseUnavailable | None = None


class ParallelWriter:
    """Writes chains of batches in the background with up to ``in_flight`` concurrent inserts."""

    def __init__(self, open_client: Callable[[], Client], fault: Fault | None, in_flight: int = 2) -> None:
        self._open_client = open_client
        self._fault = fault
        self._local = threading.local()
        self._clients: list[Client] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, in_flight), thread_name_prefix="rewardflow-insert")

    def _writer(self) -> BatchWriter:
        client: Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self._open_client()
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return BatchWriter(client, self._fault)

    def _chain(self, chain: Sequence[Batch]) -> ChainResult:
        result = ChainResult()
        for i, batch in enumerate(chain):
            try:
                dead = self._writer().write(batch)
            except ClickHouseUnavailable as exc:
                result.remaining, result.error = list(chain[i:]), exc
                return result
            except Exception as exc:  # e.g. the connection could not be opened
                if not is_driver_error(exc):
                    raise
                result.remaining, result.error = list(chain[i:]), ClickHouseUnavailable(clean_message(exc))
                return result
            result.written.append((batch, len(dead)))
        return result

    def submit(self, chain: Sequence[Batch]) -> Future[ChainResult]:
        """Start writing ``chain`` (one partition's batches, in offset order); returns at once."""
        return self._pool.submit(self._chain, list(chain))

    def close(self) -> None:
        """Wait for the running chains, stop the threads and close every connection. Idempotent."""
        self._pool.shutdown(wait=True)
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()
