"""Validation of decoded event dicts against the contract.

Contract: pure, no I/O. :func:`validate_event` returns a frozen model or raises
:class:`InvalidEvent` naming the first offending field (``producer.name``,
``lines_added`` …) and the reason. :func:`split_valid` never raises for a bad
event: it returns it with its index in the batch so it alone is dead-lettered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import ValidationError

from rewardflow.events.errors import InvalidEvent
from rewardflow.events.models import EVENT_MODELS, Envelope, Event


_VALIDATORS = {name: model.__pydantic_validator__ for name, model in EVENT_MODELS.items()}


@dataclass(frozen=True, slots=True)
class Rejected:
    """An event that failed validation, with its position in the record."""

    index: int
    raw: Any
    error: InvalidEvent


def shown(value: Any, limit: int) -> str:
    """``value`` as at most ``limit`` characters for a message or a dead letter; never raises.

    Containers are named by type only: ``str()`` of a deeply nested list (a JSON
    bomb inside one field) raises ``RecursionError``, as does ``str()`` of an
    int with thousands of digits (``ValueError``).
    """
    if isinstance(value, str):
        return value[:limit]
    if value is None or isinstance(value, bool | float) or (isinstance(value, int) and value.bit_length() <= 64):
        return str(value)[:limit]
    return f"<{type(value).__name__}>"[:limit]


def max_length(model: type[Envelope], name: str) -> int | None:
    """The schema's ``maxLength`` of string field ``name`` of ``model`` (optional or not), or None."""
    pending: list[Any] = [model.model_fields[name]]
    while pending:
        item = pending.pop()
        found = getattr(item, "max_length", None)
        if isinstance(found, int):
            return found
        pending += getattr(item, "metadata", None) or getattr(item, "__metadata__", None) or ()
        pending += get_args(getattr(item, "annotation", None) or item) if not isinstance(item, type) else ()
    return None


def _field_of(err: dict[str, Any]) -> str:
    loc = [str(p) for p in err.get("loc", ())]
    if loc and loc[0] in EVENT_MODELS:  # discriminated-union tag
        loc = loc[1:]
    return ".".join(loc) or "event_type"


def validate_event(raw: Any, index: int | None = None) -> Event:
    """Validate one decoded event dict. Raises ``InvalidEvent``."""
    if not isinstance(raw, dict):
        raise InvalidEvent("<event>", f"expected an object, got {type(raw).__name__}", index=index)
    etype = raw.get("event_type")
    if not isinstance(etype, str) or etype not in EVENT_MODELS:  # a list or dict tag is unhashable
        raise InvalidEvent("event_type", f"unknown event type {shown(etype, 64)!r}; expected one of {sorted(EVENT_MODELS)}", index=index)
    try:  # the tag is known, so its model's validator directly (same result as EVENT_ADAPTER, 1 µs less)
        return _VALIDATORS[etype].validate_python(raw)  # type: ignore[no-any-return]
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise InvalidEvent(_field_of(dict(err)), str(err["msg"])[:200], index=index) from None


def split_valid(raws: Iterable[Any]) -> tuple[list[Event], list[Rejected]]:
    """Validate a record's events; keep order of the valid ones.

    Same result as :func:`validate_event` per event; the common case (a dict of a known type that
    validates) is inlined here, and anything else goes through ``validate_event`` for its error.
    """
    ok: list[Event] = []
    bad: list[Rejected] = []
    validators = _VALIDATORS
    for i, raw in enumerate(raws):
        if type(raw) is dict:
            etype = raw.get("event_type")
            validator = validators.get(etype) if type(etype) is str else None
            if validator is not None:
                try:
                    ok.append(validator.validate_python(raw))
                    continue
                except ValidationError:
                    pass  # validate_event names the field and the reason
        try:
            ok.append(validate_event(raw, i))
        except InvalidEvent as exc:
            bad.append(Rejected(i, raw, exc))
    return ok, bad


def to_dict(event: Envelope) -> dict[str, Any]:
    """Plain dict of an event, as the wire encoders and the events table expect."""
    return event.model_dump()
