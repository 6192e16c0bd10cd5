"""One session's admitted events as the Kafka records the worker takes whole. Pure.

The worker dead-letters a record over ``REWARDFLOW_MAX_RECORD_BYTES`` (``too_large``) or with more
than ``REWARDFLOW_MAX_BATCH_EVENTS`` events (``batch_too_large``), and a request's body limit and
event limit are set apart from those: a request the edge accepts can hold a session whose events,
with the ``org_id`` and ``client_ts`` the edge adds, do not fit one record. :func:`session_records`
splits such a session into consecutive records that fit, in event-time order (one key, so one
partition, so the worker reads them in that order): a later record never holds an event older than
an earlier one's, so no split makes an event late that one record would have carried in time.

Contract: the records' bytes are what :func:`~rewardflow.events.wire.encode_json` writes for each
run of events (one event alone as its object, several as ``{"events": [...]}``); every event is in
exactly one record, the events sorted by ``ts`` (stably: events of one ``ts`` keep the request's
order). Raises :class:`RecordTooLarge`, before anything is produced, for an event that
alone encodes to more than ``max_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

_HEAD, _TAIL = b'{"events":[', b"]}"


class RecordTooLarge(ValueError):
    """An event that alone does not fit a record; ``str()`` names it and the limit."""


def session_records(events: Sequence[dict[str, Any]], max_bytes: int, max_events: int) -> list[bytes]:
    """``events`` (one session's, at least one) as the fewest consecutive records of at most
    ``max_events`` events and ``max_bytes`` bytes each, greedily in event-time order."""
    events = sorted(events, key=lambda e: e["ts"])
    encoded = [orjson.dumps(e) for e in events]
    records: list[bytes] = []
    run: list[bytes] = []
    size = len(_HEAD) + len(_TAIL) - 1  # the framing of a run, less the comma its first event does not take

    def close() -> None:
        records.append(run[0] if len(run) == 1 else _HEAD + b",".join(run) + _TAIL)

    for i, data in enumerate(encoded):
        if len(data) > max_bytes:
            raise RecordTooLarge(f"event {i} of session {str(events[i].get('session_id'))[:128]!r} encodes to "
                                 f"{len(data):,} bytes; a record holds at most {max_bytes:,} "
                                 "(REWARDFLOW_MAX_RECORD_BYTES)")
        if run and (len(run) >= max_events or size + 1 + len(data) > max_bytes):
            close()
            run, size = [], len(_HEAD) + len(_TAIL) - 1
        run.append(data)
        size += 1 + len(data)
    close()
    return records
