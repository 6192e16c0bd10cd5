"""The read-only guard of every read path, built on ClickHouse's own parser.

A statement is accepted when the engine that will run it says it is:

1. ``formatQuery`` parses it and prints it back canonically: one statement
   (multi-statements are a syntax error), comments dropped, every string literal
   in one quoting style. Nothing the parser does not see (a comment, a heredoc,
   a string) can hide a keyword from the checks below, and the canonical text
   is what runs.
2. ``INTO OUTFILE`` outside string literals of the canonical text is refused: it
   makes the engine write a file (chDB does so in-process, whatever ``readonly``);
   so is a ``SETTINGS`` clause (limits are fixed by the reader, and ``EXPLAIN``
   would already apply it). So is a statement its parameters would change: the
   engine binds ``{name:Type}`` placeholders, but a driver writes the values into
   a statement that has none (clickhouse-connect's ``%(name)s``), where a quote in
   a value can end a string literal and turn the rest into SQL. ``bind`` (the
   reader's driver) says what text would reach the engine; it must be the
   canonical text, before ``EXPLAIN`` runs it too.
3. ``EXPLAIN AST`` of the canonical text gives the tree: its root must be a read
   (``SELECT``, ``WITH``, ``SHOW``, ``DESCRIBE``, ``EXPLAIN``, ``EXISTS``), no
   node may be a ``SETTINGS`` clause, and no function may be a table function outside :data:`TABLE_FUNCTIONS`, wherever it
   stands (``file``, ``url``, ``remote``, ``s3``, ``executable``, ``python`` … reach
   files, URLs, processes or other servers). No table may be one of :data:`PRIVATE_TABLES`
   (``system.processes`` and the logs show other readers' statements), nor may ``merge``
   read the ``system`` database; ``SHOW PROCESSLIST`` is refused.

Every statement also runs on a connection with ``readonly = 1`` and the read
limits (:func:`~.readonly.read_settings`), which the engine enforces.

Contract: :meth:`SqlGuard.check` returns the canonical statement or raises
:class:`~.readonly.ReadOnlyViolation` (``refused: …``, naming what was refused);
any other error of ``run`` propagates (a statement the engine cannot explain
with its parameters, say). It runs two small queries on the engine, blocking as they are, the first
time it sees a statement with its parameters: an accepted one is remembered (the last
:data:`VERDICTS_KEPT`, by a digest of the statement and its parameters), and the same request again
returns its canonical form without asking the engine. A refusal is never remembered: it is asked
again each time. The engine's parser and functions are those of the process, so a verdict cannot change
while it runs.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from rewardflow.clickhouse.errors import clean_message, error_code
from rewardflow.clickhouse.readonly import ReadOnlyViolation

Run = Callable[[str, Mapping[str, Any]], list[tuple[Any, ...]]]
"""Runs one statement with parameters on the engine and returns its rows."""
Bind = Callable[[str, Mapping[str, Any]], str | bytes]
"""The text a reader's driver sends to the engine for one statement with parameters."""

TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "generate_series", "generateseries", "generaterandom",
    "values", "view", "null", "merge", "primes",
})
"""Table functions a read may use (lower case): they read nothing outside the database."""

READ_ROOTS = ("SelectWithUnionQuery", "SelectIntersectExceptQuery", "Show", "Exists", "Describe", "Explain")
_LITERALS = re.compile(r"'(?:[^'\\]|\\.)*'|`(?:[^`\\]|\\.)*`|\"(?:[^\"\\]|\\.)*\"", re.DOTALL)
_OUTFILE = re.compile(r"\bINTO\s+OUTFILE\b", re.IGNORECASE)
_SETTINGS = re.compile(r"\bSETTINGS\b")  # formatQuery writes keywords in capitals
_SYNTAX_ERROR = 62  # (what EXPLAIN AST says of a statement that is no query, such as SYSTEM)
_NODE = re.compile(r"^\s*(\S+)(?:\s+(\S+))?")
VERDICTS_KEPT = 512
"""Accepted statements a guard remembers (a dashboard's or a poller's repeated queries skip the parser)."""
_KEPT_CHARS = 16_384  # a longer statement is checked every time (what is kept stays within ~8 MB a guard)


class SqlGuard:
    """The guard of one engine (see the module doc). Not thread-safe; one per connection."""

    def __init__(self, run: Run, bind: Bind | None = None) -> None:
        """``run`` asks the engine; ``bind``: how ``run`` and the reader send a statement's parameters
        (None: the engine binds them all, as ``{name:Type}`` placeholders)."""
        self._run = run
        self._bind = bind
        self._table_functions: frozenset[str] | None = None
        self._accepted: OrderedDict[bytes, str] = OrderedDict()
        self._kept_lock = threading.Lock()  # (the verdicts kept may be shared, whatever the rest of the guard)

    def check(self, sql: str, parameters: Mapping[str, Any] | None = None) -> str:
        """The canonical form of ``sql`` if it is one read statement; else raise (module doc)."""
        params = dict(parameters or {})
        key = _request_key(sql, params) if len(sql) <= _KEPT_CHARS else None
        if key is not None:
            with self._kept_lock:
                kept = self._accepted.get(key)
                if kept is not None:
                    self._accepted.move_to_end(key)
            if kept is not None:
                self._unchanged_by(kept, params)  # (on every call, whatever was kept: it costs no query)
                return kept
        canonical = self._verdict(sql, params)
        if key is not None and len(canonical) <= _KEPT_CHARS:
            with self._kept_lock:
                self._accepted[key] = canonical
                while len(self._accepted) > VERDICTS_KEPT:
                    self._accepted.popitem(last=False)
        return canonical

    def _verdict(self, sql: str, params: dict[str, Any]) -> str:
        """Ask the engine (module doc): the canonical statement, or raise."""
        try:
            canonical = str(self._run("SELECT formatQuery({q:String})", {"q": sql})[0][0])
        except Exception as exc:  # noqa: BLE001 - the parser's refusal, whatever the driver wraps it in
            raise ReadOnlyViolation(f"refused: not one statement ClickHouse can parse: {_first_line(exc)}") from None
        bare = _LITERALS.sub("''", canonical)
        if _OUTFILE.search(bare):
            raise ReadOnlyViolation("refused: INTO OUTFILE writes a file; reads only")
        if _SETTINGS.search(bare):  # (EXPLAIN would apply them, so before it)
            raise ReadOnlyViolation("refused: a SETTINGS clause; the reader's settings and limits are fixed")
        self._unchanged_by(canonical, params)
        try:
            tree = [str(row[0]) for row in self._run("EXPLAIN AST " + canonical, params)]
        except Exception as exc:
            if error_code(exc) != _SYNTAX_ERROR:
                raise
            raise ReadOnlyViolation(f"refused: not a read statement ({clean_message(exc)[:300]})") from None
        root = _NODE.match(tree[0]) if tree else None
        if root is None or not root.group(1).startswith(READ_ROOTS):
            kind = root.group(1) if root else "an empty statement"
            raise ReadOnlyViolation(f"refused: {kind} is not a read; only SELECT, WITH, SHOW, DESCRIBE, "
                                    "EXPLAIN and EXISTS are allowed")
        if root.group(1) == "ShowProcesslistQuery":
            raise ReadOnlyViolation(_OTHERS_STATEMENTS)
        banned = self.table_functions() - TABLE_FUNCTIONS
        for at, line in enumerate(tree[1:], 1):
            node = _NODE.match(line)
            if node is None:
                continue
            if node.group(1) == "Set":
                raise ReadOnlyViolation("refused: a SETTINGS clause; the reader's settings and limits are fixed")
            if node.group(1) == "Function" and (node.group(2) or "").lower() in banned:
                raise ReadOnlyViolation(f"refused: the function {node.group(2)} reaches outside the database "
                                        f"(allowed table functions: {', '.join(sorted(TABLE_FUNCTIONS))})")
            if node.group(1) == "TableIdentifier" and _private(node.group(2) or ""):
                raise ReadOnlyViolation(_OTHERS_STATEMENTS)
            if node.group(1) == "Function" and (node.group(2) or "").lower() == "merge" and _merges_system(tree, at):
                raise ReadOnlyViolation(_OTHERS_STATEMENTS)
        return canonical

    def _unchanged_by(self, canonical: str, params: Mapping[str, Any]) -> None:
        """Raise unless the reader's driver sends ``canonical`` with ``params`` as it is (module doc, point 2)."""
        if params and self._bind is not None and self._sent(canonical, params) != canonical:
            raise ReadOnlyViolation("refused: the parameters would be written into the statement's text; "
                                    "bind each as a {name:Type} placeholder, which the engine fills in")

    def _sent(self, statement: str, params: Mapping[str, Any]) -> str | bytes | None:
        """The text the driver would send for ``statement`` and ``params`` (None: it cannot bind them)."""
        assert self._bind is not None
        try:
            return self._bind(statement, params)
        except Exception:  # noqa: BLE001 - a driver's refusal to format (a stray %), whatever it raises
            return None

    def table_functions(self) -> frozenset[str]:
        """The engine's table functions, lower case (asked once)."""
        if self._table_functions is None:
            rows = self._run("SELECT name FROM system.table_functions", {})
            self._table_functions = frozenset(str(r[0]).lower() for r in rows) | {"file", "url", "remote", "s3"}
        return self._table_functions


PRIVATE_TABLES = frozenset({
    "processes", "query_log", "query_thread_log", "query_views_log", "processors_profile_log", "query_cache",
    "session_log", "text_log", "trace_log", "stack_trace", "opentelemetry_span_log", "asynchronous_insert_log",
    "asynchronous_inserts", "crash_log", "errors", "error_log", "part_log", "backup_log", "zookeeper_log",
})
"""Tables of the ``system`` database that show other readers' statements (their literals too) or their
traces: refused by name, qualified or not (no rewardflow table has these names)."""
_OTHERS_STATEMENTS = ("refused: the running and logged statements of the engine are other readers'; read the "
                      "rewardflow tables and views")
_ARGUMENT = re.compile(r"^\s*Literal '((?:[^'\\]|\\.)*)'$")


def _private(table: str) -> bool:
    database, _, name = table.rpartition(".")
    return database in ("", "system") and name in PRIVATE_TABLES


def _merges_system(tree: list[str], at: int) -> bool:
    """Whether the ``merge`` table function at line ``at`` of the tree may read the ``system`` database: its
    database argument is ``system``, or not a plain string (a ``REGEXP`` may match it)."""
    lines = tree[at + 1:at + 4]
    if len(lines) < 2 or not lines[0].lstrip().startswith("ExpressionList (children "):
        return True
    if lines[0].rstrip().endswith("(children 1)"):
        return False  # (one argument: the current database's tables)
    first = _ARGUMENT.match(lines[1])
    return first is None or first.group(1).lower() in ("system", "information_schema")


def _request_key(sql: str, params: Mapping[str, Any]) -> bytes | None:
    """A digest of the statement and its parameters (names, types and values), for the verdicts kept;
    None for parameters that cannot be written out (nested too deep, an int too long): not kept. Each
    part is preceded by its length, so no statement and parameters digest as another pair does."""
    h = hashlib.blake2b(digest_size=20)
    try:
        parts = [sql, *(repr((str(name), type(params[name]).__qualname__, params[name]))
                        for name in sorted(params, key=str))]
    except (RecursionError, ValueError):
        return None
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.digest()


def _first_line(exc: BaseException) -> str:
    """The engine's message in one line of at most ~300 characters, cut between words: a syntax error's
    list of what the parser expected keeps its first few entries."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    line = line.split(": In scope", 1)[0]
    head, marker, expected = line.partition("Expected one of: ")
    if marker:
        options = expected.split(", ")
        line = head + marker + ", ".join(options[:6]) + (", …" if len(options) > 6 else "")
    if len(line) > 300:
        line = line[:300].rsplit(" ", 1)[0] + " …"
    return line
