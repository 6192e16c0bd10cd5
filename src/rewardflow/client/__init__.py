"""The producer SDK: send rewardflow events to Kafka, batched per session, every outcome counted.

    from rewardflow.client import EventProducer, ProducerConfig

    with EventProducer(config=ProducerConfig(wire_format="avro")) as producer:
        producer.emit(event)          # a pydantic event model (trusted), or a dict (validated)
    # on exit: flushed; raises UndeliveredEvents if any event was not delivered

Records: key = ``session_id``; value = one ``EventBatch`` of that session's
events (Avro, Confluent framing, the default) or ``{"events": [...]}`` (JSON);
header ``rf-format`` = ``avro`` | ``json``. Any rewardflow consumer reads both
with :func:`rewardflow.events.wire.decode_record`.

Limits (settings, ``REWARDFLOW_…``):

* ``max_record_bytes`` (default 1,000,000 B): no record the SDK writes is
  larger. A session batch that would grow past it is split; a single event
  that cannot fit alone is refused by ``emit`` with :class:`RecordTooLarge`.
* ``max_batch_events`` (default 500): the most events in one record, and the
  ceiling of ``ProducerConfig.max_events``.

Errors: ``InvalidEvent`` / ``RecordTooLarge`` (that event refused, nothing
sent), :class:`BufferFull` (alias :data:`ProducerBackpressure`: too many
events pending, the event refused), :class:`UndeliveredEvents` (from
``flush``/``close``/exit: failures by reason, counts), :class:`ProducerClosed`.

See :mod:`rewardflow.client.producer` for the delivery and ordering contract.
"""

from rewardflow.client.config import ProducerConfig
from rewardflow.client.delivery import ProducerStats
from rewardflow.client.errors import (
    BufferFull,
    ProducerBackpressure,
    ProducerClosed,
    ProducerError,
    RecordTooLarge,
    UndeliveredEvents,
)
from rewardflow.client.producer import EventProducer
from rewardflow.events.errors import InvalidEvent

__all__ = [
    "BufferFull",
    "EventProducer",
    "InvalidEvent",
    "ProducerBackpressure",
    "ProducerClosed",
    "ProducerConfig",
    "ProducerError",
    "ProducerStats",
    "RecordTooLarge",
    "UndeliveredEvents",
]
