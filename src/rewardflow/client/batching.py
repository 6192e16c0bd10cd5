"""Session batches: each session's encoded events gathered into one record.

A batch closes when it holds ``max_events`` events, when the next event would
push the record past ``max_record_bytes`` (the batch is split there), or
``max_delay_s`` after its first event. Pure bookkeeping: no Kafka, an
injectable clock (read once per opened batch, and by :meth:`expired`), not
thread-safe (the producer holds its lock around every call).

Hot path: the producer may append to an open batch itself (:attr:`SessionBatcher.open`),
exactly as :meth:`SessionBatcher.add` does when the piece fits: append the
piece, take its size off ``room`` and one off ``left``, and :meth:`close` the
batch when ``left`` reaches 0. Every other case goes through ``add``.

Ordering: batches close in the order they must be sent. For one session, a
closed batch always holds events emitted before those of any later batch.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from rewardflow.client.encoding import EventEncoder
from rewardflow.client.errors import RecordTooLarge

NOTHING: tuple[SessionBatch, ...] = ()


@dataclass(slots=True)
class SessionBatch:
    """The open or closed batch of one session: its encoded events, in emit order."""

    session_id: str
    key: bytes
    """The Kafka key: the session id, UTF-8."""
    head: bytes
    """The first bytes of the batch's record (frame, batch id, session id)."""
    opened: float
    room: int
    """Bytes the record may still grow by (each piece costs its length plus a separator)."""
    left: int
    """Events the batch may still take before it is full (``max_events - count``)."""
    pieces: list[bytes] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.pieces)


class SessionBatcher:
    """Open batches by session id, oldest first."""

    def __init__(self, encoder: EventEncoder, max_events: int, max_record_bytes: int, max_delay_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._encoder = encoder
        self._sep_len = len(encoder.separator)
        self._max_events = max_events
        self._max_record_bytes = max_record_bytes
        self._max_delay_s = max_delay_s
        self._clock = clock
        self.open: dict[str, SessionBatch] = {}
        """Open batches by session id, oldest first (read by the producer's hot path)."""
        self._ids = _batch_ids()

    @property
    def buffered(self) -> int:
        """Events in open batches (counted on demand: the hot path keeps no running total)."""
        return sum(len(b.pieces) for b in self.open.values())

    def add(self, session_id: str, event_id: str, piece: bytes) -> tuple[SessionBatch, ...]:
        """Append one event's piece; return the batches this closed, in send order.

        Raises :class:`RecordTooLarge`, changing nothing, when the event alone
        would make a record over ``max_record_bytes``.
        """
        batch = self.open.get(session_id)
        size = len(piece) + self._sep_len
        if batch is not None and batch.room >= size:  # the common case: append
            closed = NOTHING
        else:
            head = self._encoder.head(next(self._ids), session_id)
            alone = len(head) + self._encoder.tail + size
            if alone > self._max_record_bytes:
                raise RecordTooLarge(event_id, alone, self._max_record_bytes)
            closed = NOTHING if batch is None else (self.close(batch),)  # full by size: split here
            batch = self._new(session_id, head)
        batch.pieces.append(piece)
        batch.room -= size
        batch.left -= 1
        if not batch.left:
            return (*closed, self.close(batch))
        return closed

    def expired(self) -> list[SessionBatch]:
        """Close and return every batch opened at least ``max_delay_s`` ago, oldest first."""
        deadline = self._clock() - self._max_delay_s
        due = list(itertools.takewhile(lambda b: b.opened <= deadline, self.open.values()))
        return [self.close(b) for b in due]

    def drain(self) -> list[SessionBatch]:
        """Close and return every open batch, oldest first."""
        return [self.close(b) for b in list(self.open.values())]

    def __len__(self) -> int:
        return len(self.open)

    def _new(self, session_id: str, head: bytes) -> SessionBatch:
        room = self._max_record_bytes - len(head) - self._encoder.tail
        batch = SessionBatch(session_id, session_id.encode(), head, self._clock(), room, self._max_events)
        self.open[session_id] = batch
        return batch

    def close(self, batch: SessionBatch) -> SessionBatch:
        """Remove the open ``batch`` and return it (now closed, ready to send)."""
        del self.open[batch.session_id]
        return batch


def _batch_ids() -> Iterator[str]:
    """``<12 hex of a random producer id>-<sequence>``: unique and cheap."""
    prefix = uuid.uuid4().hex[:12]
    return (f"{prefix}-{n}" for n in itertools.count())
