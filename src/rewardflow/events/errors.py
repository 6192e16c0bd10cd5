"""Typed errors of the event contract. Each names its reason; none is swallowed.

:class:`DecodeError` means the bytes are not a readable record (the whole
record is dead-lettered). :class:`InvalidEvent` means one event broke the
contract (that event alone is dead-lettered; the rest of a batch goes on).
"""

from __future__ import annotations


class EventError(ValueError):
    """Base of the contract's errors. ``code`` is a stable machine-readable reason."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def reason(self) -> str:
        return f"{self.code}: {self}"


class DecodeError(EventError):
    """The record's bytes cannot be decoded.

    Codes: ``unknown_format``, ``bad_magic``, ``unknown_schema_id``,
    ``truncated_avro``, ``bad_avro``, ``bad_json``, ``not_an_event``,
    ``too_large``, ``batch_too_large``.
    """

    code = "decode_error"


class InvalidEvent(EventError):
    """One event violates the contract. ``field`` names the offending field."""

    code = "invalid_event"

    def __init__(self, field: str, message: str, *, index: int | None = None) -> None:
        where = f"event[{index}]." if index is not None else ""
        super().__init__(f"{where}{field}: {message}")
        self.field = field
        self.index = index
