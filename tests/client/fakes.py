"""A stand-in for confluent_kafka.Producer: records what is produced, reports deliveries on poll/flush."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeError:
    """Quacks like confluent_kafka.KafkaError for the ledger."""

    code: str
    text: str

    def name(self) -> str:
        return self.code

    def str(self) -> str:
        return self.text


@dataclass
class FakeKafka:
    """``fail_with``: report every delivery as this error; ``refuse``: raise BufferError on produce."""

    config: dict[str, Any]
    records: list[tuple[str, bytes, bytes, list[tuple[str, Any]]]] = field(default_factory=list)
    fail_with: FakeError | None = None
    refuse: int = 0
    _waiting: list[Callable[[Any, Any], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def produce(self, topic: str, value: bytes, key: bytes, headers: Any = None, on_delivery: Any = None) -> None:
        if self.refuse:
            self.refuse -= 1
            raise BufferError("queue full")
        with self._lock:
            self.records.append((topic, value, key, list(headers or [])))
            self._waiting.append(on_delivery)

    def poll(self, timeout: float = 0) -> int:
        with self._lock:
            served, self._waiting = self._waiting, []
        for callback in served:
            callback(self.fail_with, None)
        return len(served)

    def flush(self, timeout: float = -1) -> int:
        self.poll()
        return 0


def factory(holder: list[FakeKafka], **kwargs: Any) -> Callable[[dict[str, Any]], FakeKafka]:
    """A ``kafka_factory`` that keeps the fake it builds in ``holder``."""

    def build(config: dict[str, Any]) -> FakeKafka:
        fake = FakeKafka(config, **kwargs)
        holder.append(fake)
        return fake

    return build
