"""The read-only guard for analyst SQL and the owner's read endpoint. Pure.

Two layers, both always applied by rewardflow's read paths:

1. :func:`check_read_only` refuses, before anything reaches ClickHouse, any
   text that is not a single ``SELECT`` / ``WITH`` / ``SHOW`` / ``DESCRIBE`` /
   ``EXPLAIN`` / ``EXISTS`` statement, or that asks for ``INTO OUTFILE``;
2. the query itself runs with the ClickHouse setting ``readonly = 1``
   (:data:`READONLY_SETTINGS`), which the server enforces and which a query
   cannot switch off.

The first layer gives a clear message; the second is the guarantee.
"""

from __future__ import annotations

import re

READONLY_SETTINGS: dict[str, int] = {"readonly": 1}

ALLOWED = ("SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS")

_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/|#[^\n]*", re.DOTALL)
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`", re.DOTALL)
_FIRST_WORD = re.compile(r"^\s*\(*\s*([A-Za-z]+)")
_OUTFILE = re.compile(r"\bINTO\s+OUTFILE\b", re.IGNORECASE)


class ReadOnlyViolation(ValueError):
    """The statement would write, or is not a single read statement."""


def _strip(sql: str) -> str:
    """SQL with string literals blanked and comments removed (for keyword checks only)."""
    blanked = _STRING.sub("''", sql)
    return _COMMENT.sub(" ", blanked)


def check_read_only(sql: str) -> str:
    """Return ``sql`` without a trailing ``;`` if it is one read statement; else raise.

    Raises :class:`ReadOnlyViolation` whose message names the refused keyword,
    e.g. ``"refused: INSERT is a write; rewardflow sql is read-only"``.
    """
    text = sql.strip()
    while text.endswith(";"):
        text = text[:-1].rstrip()
    bare = _strip(text)
    if not bare.strip():
        raise ReadOnlyViolation("refused: empty statement")
    if ";" in bare:
        raise ReadOnlyViolation("refused: one statement at a time (found ';')")
    match = _FIRST_WORD.match(bare)
    keyword = match.group(1).upper() if match else bare.split()[0].upper()
    if keyword not in ALLOWED:
        raise ReadOnlyViolation(
            f"refused: {keyword} is not a read statement; only {', '.join(ALLOWED)} are allowed (read-only)"
        )
    if _OUTFILE.search(bare):
        raise ReadOnlyViolation("refused: INTO OUTFILE writes a file; read-only")
    return text
