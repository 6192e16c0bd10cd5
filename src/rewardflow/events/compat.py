"""Avro schema resolution as a compatibility check (Avro 1.11 spec, "Schema Resolution").

:func:`check_backward` answers: can a consumer that holds ``reader`` (the new
schema) read every datum written with ``writer`` (an old schema)? It returns
one human-readable line per incompatibility, prefixed by the path of the
offending field; an empty list means compatible. The rules:

* primitives match themselves; the writer may be *promoted*:
  int → long, float, double; long → float, double; float → double;
  string ↔ bytes;
* records match by unqualified name (or a reader alias); fields match by name
  (or a reader field alias) and order is irrelevant. A writer field the reader
  lacks is skipped; a reader field the writer lacks needs a default, and that
  default must fit the field's type (for a union: its first branch);
* enums match by name; every writer symbol must be a reader symbol unless the
  reader enum has a default; fixed types match by name and size;
* arrays and maps resolve their items / values;
* a writer union: every branch must be readable by the reader; a non-union
  writer read as a union: some reader branch must read it.

Contract: pure, no I/O, never raises for a well-formed schema. Schemas are
parsed JSON (``str | list | dict``) with named types defined once and then
referenced by name, as ``fastavro.schema.load_schema`` produces. Logical types
resolve on their underlying type. An undefined name is reported as an
incompatibility.
"""

from __future__ import annotations

from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


def check_backward(reader: Any, writer: Any) -> list[str]:
    """Incompatibilities met when ``reader`` reads data written with ``writer``; ``[]`` if none."""
    root = _short(str(reader["name"])) if isinstance(reader, dict) and "name" in reader else "<root>"
    return _Checker(reader, writer).check(reader, "", writer, "", root)


def is_backward_compatible(reader: Any, writer: Any) -> bool:
    """``True`` when :func:`check_backward` finds nothing."""
    return not check_backward(reader, writer)


def fullname(name: str, namespace: str) -> str:
    """Avro full name: ``name`` if it already has a dot, else ``namespace.name``."""
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _space(full: str) -> str:
    return full.rsplit(".", 1)[0] if "." in full else ""


def _short(full: str) -> str:
    return full.rsplit(".", 1)[-1]


def collect_names(schema: Any, namespace: str = "", names: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Every named type defined in ``schema``, by full name."""
    names = {} if names is None else names
    if isinstance(schema, list):
        for branch in schema:
            collect_names(branch, namespace, names)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in NAMED:
            full = fullname(str(schema["name"]), str(schema.get("namespace", namespace)))
            names.setdefault(full, schema)
            namespace = _space(full)
        if kind in ("record", "error"):
            for field in schema.get("fields", []):
                collect_names(field["type"], namespace, names)
        elif kind == "array":
            collect_names(schema["items"], namespace, names)
        elif kind == "map":
            collect_names(schema["values"], namespace, names)
        elif isinstance(kind, (dict, list)):
            collect_names(kind, namespace, names)
    return names


def kind_of(schema: Any) -> str:
    """``union``, a primitive name, or a complex type's ``type`` (of a resolved schema)."""
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    return str(schema["type"])


class _Checker:
    """One comparison: both name tables plus the pairs already under comparison."""

    def __init__(self, reader: Any, writer: Any) -> None:
        self.names = (collect_names(reader), collect_names(writer))
        self.seen: set[tuple[int, int]] = set()

    def resolve(self, schema: Any, namespace: str, side: int) -> tuple[Any, str]:
        """Dereference a name or a ``{"type": ...}`` wrapper; returns (schema, its namespace)."""
        while True:
            if isinstance(schema, str) and schema not in PRIMITIVES:
                table = self.names[side]
                target = table.get(fullname(schema, namespace), table.get(schema))
                if target is None:
                    raise LookupError(f"undefined named type {schema!r}")
                schema = target
            if isinstance(schema, dict):
                kind = schema["type"]
                if kind in NAMED:
                    return schema, _space(fullname(str(schema["name"]), str(schema.get("namespace", namespace))))
                if kind not in ("array", "map"):
                    schema = kind  # primitive with attributes (logical type) or nested type
                    continue
            return schema, namespace

    def check(self, reader: Any, rns: str, writer: Any, wns: str, path: str) -> list[str]:
        try:
            reader, rns = self.resolve(reader, rns, 0)
            writer, wns = self.resolve(writer, wns, 1)
        except LookupError as exc:
            return [f"{path}: {exc}"]
        key = (id(reader), id(writer))
        if key in self.seen:  # recursive type: assume the pair holds while it is being proved
            return []
        self.seen.add(key)
        try:
            return self._check(reader, rns, writer, wns, path)
        finally:
            self.seen.discard(key)

    def _check(self, reader: Any, rns: str, writer: Any, wns: str, path: str) -> list[str]:
        rk, wk = kind_of(reader), kind_of(writer)
        if wk == "union":
            out: list[str] = []
            for i, branch in enumerate(writer):
                out += self.check(reader, rns, branch, wns, f"{path}<writer branch {i}>")
            return out
        if rk == "union":
            failures = [self.check(branch, rns, writer, wns, path) for branch in reader]
            if any(not f for f in failures):
                return []
            for branch, failure in zip(reader, failures):  # the same-named branch explains best
                try:
                    resolved, ns = self.resolve(branch, rns, 0)
                except LookupError:
                    continue
                if kind_of(resolved) == wk and (wk not in NAMED or _names_match(resolved, ns, writer, wns)):
                    return failure
            return [f"{path}: no branch of the reader union {_describe(reader)} reads writer type {_describe(writer)}"]
        if (rk == wk and rk in PRIMITIVES) or (wk in PROMOTIONS and rk in PROMOTIONS[wk]):
            return []
        if rk != wk:
            return [f"{path}: writer type {_describe(writer)} cannot be read as {_describe(reader)}"]
        if rk == "array":
            return self.check(reader["items"], rns, writer["items"], wns, f"{path}[]")
        if rk == "map":
            return self.check(reader["values"], rns, writer["values"], wns, f"{path}{{}}")
        if not _names_match(reader, rns, writer, wns):
            return [f"{path}: writer {wk} {writer['name']!r} cannot be read as {rk} {reader['name']!r}"]
        if rk == "enum":
            missing = [s for s in writer["symbols"] if s not in reader["symbols"]]
            if missing and "default" not in reader:
                return [f"{path}: writer enum symbols {missing} are not in the reader enum and it has no default"]
            return []
        if rk == "fixed":
            if reader["size"] != writer["size"]:
                return [f"{path}: fixed size {writer['size']} cannot be read as size {reader['size']}"]
            return []
        return self._fields(reader, rns, writer, wns, path)

    def _fields(self, reader: dict[str, Any], rns: str, writer: dict[str, Any], wns: str, path: str) -> list[str]:
        written = {str(f["name"]): f for f in writer.get("fields", [])}
        out: list[str] = []
        for field in reader.get("fields", []):
            name = str(field["name"])
            where = f"{path}.{name}"
            source = written.get(name) or next((written[a] for a in field.get("aliases", []) if a in written), None)
            if source is not None:
                out += self.check(field["type"], rns, source["type"], wns, where)
            elif "default" not in field:
                out.append(f"{where}: reader field has no default and is missing from the writer")
            elif not self.fits(field["type"], rns, field["default"]):
                out.append(f"{where}: default {field['default']!r} does not fit the field's type")
        return out

    def fits(self, schema: Any, namespace: str, value: Any) -> bool:
        """Whether a JSON default value is valid for ``schema`` (reader side)."""
        try:
            schema, namespace = self.resolve(schema, namespace, 0)
        except LookupError:
            return False
        kind = kind_of(schema)
        if kind == "union":
            return bool(schema) and self.fits(schema[0], namespace, value)
        simple = _DEFAULT_TYPES.get(kind)
        if simple is not None:
            return isinstance(value, simple) and (kind == "boolean" or not isinstance(value, bool))
        if kind == "enum":
            return value in schema["symbols"]
        if kind == "array":
            return isinstance(value, list) and all(self.fits(schema["items"], namespace, v) for v in value)
        if kind == "map":
            return isinstance(value, dict) and all(self.fits(schema["values"], namespace, v) for v in value.values())
        if kind in ("record", "error"):
            return isinstance(value, dict) and all(
                self.fits(f["type"], namespace, value[f["name"]]) if f["name"] in value else "default" in f
                for f in schema.get("fields", [])
            )
        return False


_DEFAULT_TYPES: dict[str, type | tuple[type, ...]] = {
    "null": type(None),
    "boolean": bool,
    "int": int,
    "long": int,
    "float": (int, float),
    "double": (int, float),
    "bytes": str,
    "string": str,
    "fixed": str,
}


def _names_match(reader: dict[str, Any], rns: str, writer: dict[str, Any], wns: str) -> bool:
    r_full = fullname(str(reader["name"]), str(reader.get("namespace", rns)))
    w_full = fullname(str(writer["name"]), str(writer.get("namespace", wns)))
    if _short(r_full) == _short(w_full):
        return True
    aliases = {fullname(str(a), _space(r_full)) for a in reader.get("aliases", [])}
    return w_full in aliases


def _describe(schema: Any) -> str:
    if isinstance(schema, list):
        return "[" + ", ".join(_describe(b) for b in schema) + "]"
    if isinstance(schema, dict):
        return f"{schema['type']} {schema['name']}" if "name" in schema else str(schema["type"])
    return str(schema)
