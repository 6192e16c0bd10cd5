"""Render :mod:`rewardflow.events.models` from the Avro schemas in ``schemas/``.

The schemas are the one definition of every event. Each field may carry a
``constraints`` attribute (Avro keeps unknown attributes as metadata; the
parsing canonical form, and so the wire id, ignores them) with JSON-Schema
keywords the Avro type cannot say:

* strings: ``minLength``, ``maxLength``; ``printable: true``, printable ASCII but
  ``"`` and ``\\`` (U+0020 to U+007E), for ids and labels: the worker keeps them in its session
  state, one byte a character, and a character JSON escapes or UTF-8 widens would make a session
  outgrow the changelog record its limits are sized for (:mod:`rewardflow.core.limits`);
* numbers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``;
* ``minimumField``: the value must be at least another field's value.

Every leaf is strict, as the Avro types are (a boolean is true/false, an int is
an int); an Avro ``int`` is bounded to 32 bits; a ``double`` must be finite.
A named Avro ``enum`` becomes a ``Literal`` alias of the same name.
The fields every event shares (all but ``event_type``) form ``Envelope``; they
must be identical in every event schema. ``event_type`` becomes a one-value
``Literal`` of the record's own name, the union's discriminator.

Contract: pure functions of the schema JSON; :func:`render` raises
``ValueError`` naming the schema and field for an unknown constraint or an
unsupported type. :func:`schema_digest` is what the generated module records
and what :mod:`rewardflow.events.catalogue` compares when it loads the schemas.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

NAMESPACE = "rewardflow.events"
EVENT_TYPES = ("InferenceServed", "AgentEdit", "ToolCall", "PersistenceCheck", "UserAction", "FollowUp", "ClarifyingQuestion")
SOURCES = ("Producer", *EVENT_TYPES)
_KEYWORDS = {"minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minimumField",
             "printable"}
PRINTABLE = r"^[ !#-\[\]-~]*$"
"""The pattern of a ``printable`` string: U+0020 (space) to U+007E (``~``) but ``"`` and ``\\``."""
_PYDANTIC = {"minLength": "min_length", "maxLength": "max_length", "minimum": "ge", "maximum": "le",
             "exclusiveMinimum": "gt", "exclusiveMaximum": "lt"}
_INT32 = (-(2**31), 2**31 - 1)
_HEADER = '''"""Pydantic models of the events. GENERATED from ``schemas/*.avsc`` by ``rewardflow codegen``: do not edit.

Change a schema (its fields, docs or ``constraints``) and run ``rewardflow codegen``; the schema
catalogue refuses to load while this module's ``SCHEMA_DIGEST`` disagrees with the schema files.

Contract: models are frozen and forbid unknown fields; :data:`EVENT_ADAPTER` validates a plain
dict into the right model by ``event_type`` or raises ``pydantic.ValidationError`` whose ``loc``
names the field. Validation is pure and does no I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, Strict, TypeAdapter, ValidationInfo, field_validator

'''


def load_sources(directory: Path) -> dict[str, dict[str, Any]]:
    """The JSON of each schema the models come from, by short record name."""
    return {name: json.loads((directory / f"{NAMESPACE}.{name}.avsc").read_text()) for name in SOURCES}


def schema_digest(sources: dict[str, dict[str, Any]]) -> str:
    """sha256 of the sources' canonical JSON (sorted keys): any change of field, doc or constraint changes it."""
    text = json.dumps([sources[n] for n in SOURCES], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _lit(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _leaf(avro: Any, cons: dict[str, Any], where: str) -> str:
    """The annotated Python type of one non-null Avro type under its constraints."""
    if isinstance(avro, dict) and avro.get("type") == "enum":
        if cons:
            raise ValueError(f"{where}: an enum takes no constraints")
        return str(avro["name"])
    args = {_PYDANTIC[k]: v for k, v in cons.items() if k in _PYDANTIC}
    if cons.get("printable") is not None:
        if avro != "string" or cons["printable"] is not True:
            raise ValueError(f"{where}: printable takes true, and only on a string")
        args["pattern"] = PRINTABLE
    if avro == "string":
        base = "str"
    elif avro in ("int", "long"):
        base = "int"
        if avro == "int" and "gt" not in args:
            args.setdefault("ge", _INT32[0])
        if avro == "int" and "lt" not in args:
            args.setdefault("le", _INT32[1])
    elif avro == "double":
        base = "float"
        args["allow_inf_nan"] = False
    elif avro == "boolean":
        base = "bool"
    else:
        raise ValueError(f"{where}: unsupported Avro type {avro!r}")
    numeric = any(k in args for k in ("ge", "le", "gt", "lt"))
    if numeric and base in ("str", "bool") or base != "str" and ("min_length" in args or "max_length" in args):
        raise ValueError(f"{where}: constraint does not apply to {avro}")
    field = ", ".join(f"{k}={_lit(v)}" for k, v in args.items())
    return f"Annotated[{base}, Strict()" + (f", Field({field})]" if field else "]")


def _field(record: str, f: dict[str, Any]) -> tuple[list[str], str | None]:
    """The declaration lines of one field, and the ``minimumField`` it must cover (if any)."""
    where = f"{record}.{f['name']}"
    cons = dict(f.get("constraints", {}))
    unknown = set(cons) - _KEYWORDS
    if unknown:
        raise ValueError(f"{where}: unknown constraint {sorted(unknown)}; known: {sorted(_KEYWORDS)}")
    covers = cons.pop("minimumField", None)
    avro = f["type"]
    default = ""
    if isinstance(avro, list):
        if len(avro) != 2 or avro[0] != "null" or f.get("default", "") is not None:
            raise ValueError(f"{where}: only ['null', X] unions with default null are supported")
        typ, default = f"{_leaf(avro[1], cons, where)} | None", "default=None, "
    elif avro == f"{NAMESPACE}.Producer":
        typ = "Producer"
    else:
        typ = _leaf(avro, cons, where)
        default = f"default={_lit(f['default'])}, " if "default" in f else ""
    doc = _lit(f.get("doc", ""))
    one = f"    {f['name']}: {typ} = Field({default}description={doc})"
    if len(one) <= 120:
        return [one], covers
    return [f"    {f['name']}: {typ} = Field(", f"        {default}description={doc},", "    )"], covers


def _validator(field: str, covers: str) -> list[str]:
    return [
        "",
        f"    @field_validator({_lit(field)})",
        "    @classmethod",
        f"    def _{field}_covers_{covers}(cls, value: int, info: ValidationInfo) -> int:",
        f'        """``{field} >= {covers}``."""',
        f"        other = info.data.get({_lit(covers)})",
        "        if other is not None and value < other:",
        f'            raise ValueError(f"{field} ({{value}}) must be >= {covers} ({{other}})")',
        "        return value",
    ]


def _class(name: str, base: str, doc: str, fields: list[dict[str, Any]], literal_type: bool) -> list[str]:
    lines = ["", "", f"class {name}({base}):", f'    """{doc}"""', ""]
    if base == "BaseModel":
        lines.append('    model_config = ConfigDict(frozen=True, extra="forbid")')
    if literal_type:
        lines.append(f'    event_type: Literal["{name}"] = "{name}"')
    checks: list[str] = []
    for f in fields:
        decl, covers = _field(name, f)
        lines += decl
        if covers:
            checks += _validator(f["name"], covers)
    return lines + checks


def render(sources: dict[str, dict[str, Any]]) -> str:
    """The source text of ``rewardflow/events/models.py``."""
    events = [sources[n] for n in EVENT_TYPES]
    shared = set.intersection(*({f["name"] for f in ev["fields"]} for ev in events)) - {"event_type"}
    envelope = [f for f in events[0]["fields"] if f["name"] in shared]
    names = [f["name"] for f in envelope]
    for ev in events:
        if [f for f in ev["fields"] if f["name"] in shared] != envelope:
            raise ValueError(f"{ev['name']}: the envelope fields {names} differ from {events[0]['name']}'s")
    producer = sources["Producer"]
    out = [_HEADER.rstrip("\n"), "", f"SCHEMA_DIGEST = {_lit(schema_digest(sources))}", ""]
    for ev in events:
        for f in ev["fields"]:
            if isinstance(f["type"], dict) and f["type"].get("type") == "enum":
                symbols = ", ".join(_lit(s) for s in f["type"]["symbols"])
                out.append(f"{f['type']['name']} = Literal[{symbols}]")
    out += _class("Producer", "BaseModel", producer["doc"], producer["fields"], False)
    out += _class("Envelope", "BaseModel", "Fields every event carries; request_id is the join key, session_id the "
                  "partition key.", envelope, False)
    for ev in events:
        rest = [f for f in ev["fields"] if f["name"] not in names and f["name"] != "event_type"]
        out += _class(ev["name"], "Envelope", ev["doc"], rest, True)
    members = "".join(f"\n        {n}," for n in EVENT_TYPES)
    out += ["", "", f"Event = Annotated[\n    Union[{members}\n    ],\n    Field(discriminator=\"event_type\"),\n]", "",
            f"EVENT_MODELS: dict[str, type[Envelope]] = {{m.__name__: m for m in ({members}\n)}}", "",
            "EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)", ""]
    return "\n".join(out)
