"""Secret scrubbing of free text before it leaves the edge, with detect-secrets.

Two passes over the text:

* detect-secrets' plugins (AWS, GitHub, Slack, Stripe, JWT, private keys, "password = …" and the
  rest of its default set), line by line; a finding redacts the whole whitespace-delimited token
  it sits in (a plugin may report only a token's prefix, such as ``ghp``);
* any token of at least 20 characters whose Shannon entropy (detect-secrets' own measure) reaches
  its base64 limit (4.5 bits): API keys without a known shape (``sk-proj-…``, ``KEY=…``).

Contract: pure and thread-safe; :func:`redact` returns the scrubbed text and the number of tokens
replaced per kind. Each replaced token becomes ``[REDACTED:<kind>]``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from functools import lru_cache
from typing import Any

from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString
from detect_secrets.settings import default_settings, get_plugins

_TOKEN = re.compile(r"\S+")
_CANDIDATE = re.compile(r"[A-Za-z0-9+/=_\-.:]{20,}")
ENTROPY = "High Entropy Token"
CUT = "[CUT: longer once redacted]"


@lru_cache(maxsize=1)
def _plugins() -> tuple[Any, ...]:
    with default_settings():
        return tuple(p for p in get_plugins() if "HighEntropy" not in type(p).__name__)


_ENTROPY = Base64HighEntropyString()


def _kind_of(token: str) -> str | None:
    stripped = token.strip("\"'`,;()[]{}<>")
    for piece in _CANDIDATE.findall(stripped):
        if _ENTROPY.calculate_shannon_entropy(piece) >= _ENTROPY.entropy_limit and any(c.isdigit() for c in piece):
            return ENTROPY
    return None


def redact(text: str, max_len: int | None = None) -> tuple[str, Counter[str]]:
    """``text`` with every secret-looking token replaced, and the count replaced per kind.

    Work is linear in the text: each value a plugin reports is searched once per line, and each
    occurrence finds its token by bisection; occurrences inside a token already found are skipped.
    With ``max_len``, a result longer than that (markers can be longer than what they replace)
    is cut to ``max_len`` characters ending in :data:`CUT` (counted under ``"cut"``).
    """
    found: dict[tuple[int, int], str] = {}
    tokens = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    starts = [start for start, _ in tokens]
    for line_start, line in _lines(text):
        for plugin in _plugins():
            searched: set[str] = set()
            for secret in plugin.analyze_line(filename="text", line=line, line_number=0, context=None):
                value = secret.secret_value or ""
                if not value or value in searched:
                    continue
                searched.add(value)
                kind = str(secret.type)
                pos = line.find(value)
                while pos >= 0:
                    i = bisect_right(starts, line_start + pos) - 1
                    if i >= 0 and line_start + pos < tokens[i][1]:
                        found.setdefault(tokens[i], kind)
                        pos = line.find(value, max(pos + 1, tokens[i][1] - line_start))
                    else:
                        pos = line.find(value, pos + 1)
    for start, end in tokens:
        if (start, end) not in found:
            kind_ = _kind_of(text[start:end])
            if kind_ is not None:
                found[(start, end)] = kind_
    if not found:
        return text, Counter()
    out, last, counts = [], 0, Counter[str]()
    for (start, end), kind_ in sorted(found.items()):
        out += [text[last:start], f"[REDACTED:{kind_}]"]
        last = end
        counts[kind_] += 1
    out.append(text[last:])
    scrubbed = "".join(out)
    if max_len is not None and len(scrubbed) > max_len:
        scrubbed = scrubbed[:max(0, max_len - len(CUT))] + CUT
        counts["cut"] += 1
    return scrubbed, counts


def _lines(text: str) -> list[tuple[int, str]]:
    lines, at = [], 0
    for line in text.splitlines(keepends=True):
        lines.append((at, line.rstrip("\r\n")))
        at += len(line)
    return lines
