"""ClickHouse DSNs: parse, select a database, mask secrets. Pure.

Two forms are accepted:

* ``chdb:///abs/path[?database=name]`` - the embedded chDB engine on a
  directory (one process may own a path at a time);
* ``http(s)://user:password@host:port/database`` - a ClickHouse server.

:class:`Dsn` never shows the password: ``str()``, ``repr()`` and
:meth:`Dsn.masked` all print ``user:***@host``. Only :attr:`Dsn.secret` holds
the full string, for handing to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit


class DsnError(ValueError):
    """The DSN cannot be used; the message names the accepted forms."""


_FORMS = "use chdb:///abs/path or http(s)://user:password@host:8123/database"


@dataclass(frozen=True)
class Dsn:
    """A parsed DSN. ``database`` is None when the DSN names none (engine default)."""

    scheme: str
    database: str | None
    path: Path | None = None
    secret: str = field(default="", repr=False)

    @property
    def embedded(self) -> bool:
        """True for chDB (in-process engine)."""
        return self.scheme == "chdb"

    def with_database(self, database: str | None) -> Dsn:
        """The same target with another database (None keeps the current one)."""
        if database is None or database == self.database:
            return self
        parts = urlsplit(self.secret)
        if self.embedded:
            query = dict(parse_qsl(parts.query))
            query["database"] = database
            raw = f"chdb://{parts.path}?{urlencode(query)}"
        else:
            raw = urlunsplit((parts.scheme, parts.netloc, "/" + quote(database), parts.query, ""))
        return Dsn(self.scheme, database, self.path, raw)

    def masked(self) -> str:
        """The DSN with any password replaced by ``***``; safe for logs and errors."""
        return mask_dsn(self.secret)

    def __str__(self) -> str:
        return self.masked()

    def __repr__(self) -> str:
        return f"Dsn({self.masked()!r})"


def mask_dsn(dsn: str) -> str:
    """Replace the password of a URL-style DSN (and any ``password=`` query value) with ``***``."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "<unparseable dsn>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
    query = "&".join(
        f"{k}=***" if k.lower() in ("password", "pass", "pwd", "access_token") else f"{k}={v}"
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
    )
    masked = urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    if not netloc and dsn.startswith(f"{parts.scheme}://"):
        masked = masked.replace(f"{parts.scheme}:", f"{parts.scheme}://", 1)  # keep chdb:///abs/path
    return masked


def parse_dsn(dsn: str) -> Dsn:
    """Parse ``dsn``; raises :class:`DsnError` (with the masked DSN) if it is not usable."""
    try:
        parts = urlsplit(dsn)
    except ValueError as exc:
        raise DsnError(f"malformed ClickHouse DSN: {exc}; {_FORMS}") from None
    scheme = parts.scheme.lower()
    if scheme == "chdb":
        if parts.netloc or not parts.path.startswith("/"):
            raise DsnError(f"chDB DSN must be an absolute path, got {mask_dsn(dsn)!r}; {_FORMS}")
        database = dict(parse_qsl(parts.query)).get("database") or None
        return Dsn("chdb", database, Path(parts.path), dsn)
    if scheme in ("http", "https"):
        try:
            host, _ = parts.hostname, parts.port
        except ValueError as exc:
            raise DsnError(f"malformed ClickHouse DSN: {exc}; {_FORMS}") from None
        if not host:
            raise DsnError(f"ClickHouse DSN has no host: {mask_dsn(dsn)!r}; {_FORMS}")
        named = {k.lower() for k, _ in parse_qsl(parts.query)} & {"password", "user", "username"}
        if named:
            raise DsnError(f"put the credentials in the DSN's user:password@ part, not in ?{sorted(named)[0]}= "
                           f"({mask_dsn(dsn)!r}); {_FORMS}")
        database = parts.path.strip("/") or None
        return Dsn(scheme, database, None, dsn)
    raise DsnError(f"unsupported ClickHouse DSN scheme {parts.scheme!r}; {_FORMS}")
