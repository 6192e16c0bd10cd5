"""Producer options and the librdkafka configuration derived from them.

Fixed, not configurable: ``enable.idempotence=true`` and ``acks=all`` (no
duplicates or reordering from retries; a record counts as sent only once
every in-sync replica has it), and the raw topic's partitioner
(:data:`~rewardflow.kafka.topics.RAW_PARTITIONER`, the Java client's, so a
session maps to the same partition whichever client wrote it). Security settings come from :meth:`Settings.kafka_client_config`.

Contract: :meth:`ProducerConfig.resolve` raises ``ValueError`` naming the
option and the fix for an unsafe combination, before any connection is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rewardflow.kafka import topics
from rewardflow.settings import Settings

HEADROOM_BYTES = 64 * 1024
"""Room above ``max_record_bytes`` for the key, headers and Kafka framing of one record."""


@dataclass(frozen=True)
class ProducerConfig:
    """Knobs of :class:`~rewardflow.client.EventProducer`; ``None`` means "from settings"."""

    topic: str | None = None
    """Default: ``settings.topic(topics.RAW)``."""
    wire_format: Literal["avro", "json"] = "avro"
    max_events: int | None = None
    """Events per session batch record; default and ceiling ``settings.max_batch_events`` (consumers reject more)."""
    max_delay_ms: float = 100.0
    """A session batch is sent at most this long after its first event (sooner when full)."""
    max_pending_events: int = 100_000
    """Bound of accepted-but-unacknowledged events; beyond it ``emit`` raises ``BufferFull``."""
    block_timeout_s: float = 0.0
    """How long ``emit`` waits for room before raising ``BufferFull`` (0: raise at once)."""
    compression: Literal["lz4", "zstd", "snappy", "gzip", "none"] = "lz4"
    linger_ms: float = 10.0
    """librdkafka's wait to fill a request with several records (per partition)."""
    delivery_timeout_ms: int = 120_000
    """A record not acknowledged within this time (retries included) fails with ``_MSG_TIMED_OUT``."""
    close_timeout_s: float = 30.0
    """How long ``close()`` and the context manager's exit wait for acknowledgements."""
    kafka_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Extra librdkafka properties (e.g. ``client.id``); the fixed safety settings cannot be overridden."""

    def resolve(self, settings: Settings) -> ResolvedConfig:
        """Fill defaults from ``settings`` and check the combination."""
        max_events = self.max_events or settings.max_batch_events
        if not 1 <= max_events <= settings.max_batch_events:
            raise ValueError(
                f"max_events={max_events} must be within 1..{settings.max_batch_events} "
                "(REWARDFLOW_MAX_BATCH_EVENTS): consumers reject larger batches"
            )
        if self.max_delay_ms < 0 or self.linger_ms < 0:
            raise ValueError("max_delay_ms and linger_ms must be >= 0")
        if self.max_pending_events < max_events:
            raise ValueError(f"max_pending_events={self.max_pending_events} must be >= max_events={max_events}")
        if self.delivery_timeout_ms <= self.linger_ms:
            raise ValueError("delivery_timeout_ms must exceed linger_ms")
        if self.wire_format not in ("avro", "json"):
            raise ValueError(f"wire_format={self.wire_format!r}: use 'avro' or 'json'")
        fixed = {"enable.idempotence", "acks", "bootstrap.servers", "partitioner"}
        clash = fixed & set(self.kafka_overrides)
        if clash:
            raise ValueError(f"kafka_overrides may not set {sorted(clash)}: they are fixed by the SDK or come from settings")
        return ResolvedConfig(
            topic=self.topic or settings.topic(topics.RAW),
            wire_format=self.wire_format,
            max_events=max_events,
            max_delay_s=self.max_delay_ms / 1000.0,
            max_pending_events=self.max_pending_events,
            block_timeout_s=self.block_timeout_s,
            max_record_bytes=settings.max_record_bytes,
            close_timeout_s=self.close_timeout_s,
            bootstrap=settings.kafka_bootstrap,
            kafka=self._librdkafka(settings),
        )

    def _librdkafka(self, settings: Settings) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            **settings.kafka_client_config(),
            "client.id": "rewardflow-sdk",
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "message.timeout.ms": self.delivery_timeout_ms,
            "message.max.bytes": settings.max_record_bytes + HEADROOM_BYTES,
            "queue.buffering.max.messages": max(100_000, self.max_pending_events + 1),
            **self.kafka_overrides,
        }
        cfg.update({"enable.idempotence": True, "acks": "all", "partitioner": topics.RAW_PARTITIONER})
        return cfg


@dataclass(frozen=True)
class ResolvedConfig:
    """:class:`ProducerConfig` with every default filled in; what the producer runs on."""

    topic: str
    wire_format: str
    max_events: int
    max_delay_s: float
    max_pending_events: int
    block_timeout_s: float
    max_record_bytes: int
    close_timeout_s: float
    bootstrap: str
    kafka: dict[str, Any]
