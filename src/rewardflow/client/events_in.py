"""What ``emit`` accepts, turned into a validated event model.

* An instance of one of the event models is trusted: pydantic validated it
  when it was built (``model_construct`` skips that and is the caller's
  responsibility). It costs a type check, no validation.
* A mapping is validated by :func:`~rewardflow.events.validate.validate_event`.
* Anything else is rejected.

Contract: returns a model whose values fit the Avro schema, or raises
``InvalidEvent`` naming the field and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rewardflow.events.errors import InvalidEvent
from rewardflow.events.models import EVENT_MODELS, Envelope
from rewardflow.events.validate import validate_event

TRUSTED: frozenset[type] = frozenset(EVENT_MODELS.values())
"""The exact event model classes; an instance of one is taken as validated."""


def as_model(event: Envelope | Mapping[str, Any]) -> Envelope:
    """The validated model of one event; raises ``InvalidEvent``."""
    if type(event) in TRUSTED:
        return event  # type: ignore[return-value]  # checked by the line above
    if isinstance(event, Mapping):
        return validate_event(dict(event))
    if isinstance(event, Envelope):  # a subclass of an event model: re-validate as its base type
        return validate_event(event.model_dump())
    raise InvalidEvent("<event>", f"expected an event model or a dict, got {type(event).__name__}")


def unencodable(event: Envelope, exc: Exception) -> InvalidEvent:
    """The ``InvalidEvent`` for an encoder failure: names the first text field UTF-8 cannot encode."""
    for name, value in _texts(event.__dict__):  # not model_dump(): the model may hold values of wrong types
        try:
            value.encode()
        except UnicodeEncodeError:
            return InvalidEvent(name, "text is not encodable as UTF-8 (lone surrogate)")
    return InvalidEvent("<event>", f"does not fit the wire schema: {exc}"[:200])


def _texts(fields: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name, value in fields.items():
        if isinstance(value, str):
            out.append((prefix + name, value))
        elif isinstance(value, Mapping | BaseModel):
            out.extend(_texts(value if isinstance(value, Mapping) else value.__dict__, f"{prefix}{name}."))
    return out
