"""One DSN, two engines: clickhouse-connect clients, and the reader every read path uses.

:func:`get_client` opens a client for a chDB directory or a ClickHouse
server. :func:`open_reader` picks how to *read*:

1. a server DSN, a free chDB directory, or one this process already owns ->
   a :class:`~.readers.LocalReader` on a client in this process;
2. a chDB directory owned by another process -> that owner's read endpoint
   (``POST http://web_host:web_port/query``, served by
   :mod:`rewardflow.readapi`) through a :class:`~.remote.RemoteReader`;
3. neither -> :class:`~.errors.ReaderUnavailable` with one line saying which
   process holds the directory and what to do.

Blocking: opening a chDB engine takes ~0.1-1 s; probing the owner's endpoint
waits at most ``probe_timeout`` seconds. Credentials never appear in any
message (DSNs are masked).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import clickhouse_connect
from clickhouse_connect.driver.client import Client

from rewardflow.clickhouse.allocator import configure_engine_allocator
from rewardflow.clickhouse.dsn import Dsn, parse_dsn
from rewardflow.clickhouse.enginelock import claim_engine, probe_engine
from rewardflow.clickhouse.errors import ClickHouseError, EngineBusyError, ReaderUnavailable
from rewardflow.clickhouse.readers import LocalReader, Reader
from rewardflow.clickhouse.readonly import read_settings
from rewardflow.clickhouse.remote import RemoteReader, endpoint_alive, read_local_token
from rewardflow.settings import Settings

_BUSY_MARK = "Error initializing EmbeddedServer"


def as_dsn(dsn: str | Dsn) -> Dsn:
    """Parse a DSN string; pass a :class:`Dsn` through."""
    return dsn if isinstance(dsn, Dsn) else parse_dsn(dsn)


def get_client(*, dsn: str | Dsn, database: str | None = None, settings: dict[str, Any] | None = None) -> Client:
    """A clickhouse-connect client for ``dsn`` (database: the argument, else the DSN's).

    For chDB, this process becomes (or already is) the owner of the directory.
    Raises :class:`EngineBusyError` if another process owns it, without ever
    asking the engine (which would print ``Error initializing EmbeddedServer``
    and leave this process unable to open any engine). Driver errors
    (unreachable server, bad credentials) propagate as clickhouse-connect
    exceptions whose text contains no password.
    """
    target = as_dsn(dsn).with_database(database)
    if target.embedded:
        assert target.path is not None
        claim_engine(target.path)  # raises EngineBusyError when another process owns it
        configure_engine_allocator()
        try:
            return clickhouse_connect.get_client(dsn=f"chdb://{target.path}", database=target.database, settings=settings)
        except Exception as exc:
            if _BUSY_MARK in str(exc):
                raise EngineBusyError(f"chDB directory {target.path} was opened by another process just now") from None
            raise
    return clickhouse_connect.get_client(dsn=target.secret, database=target.database, settings=settings)


# Session settings of read connections, applied in this order (readonly last: after it, none can change).
# In-process (chDB) Arrow needs no compression; duplicates of a key never span partitions (the
# partition key is a function of the row), so FINAL may merge each partition on its own.
_CHDB_READ_SETTINGS: dict[str, Any] = {
    "output_format_arrow_compression_method": "none",
    "output_format_arrow_string_as_string": 1,
    "do_not_merge_across_partitions_select_final": 1,
}


def local_reader(dsn: Dsn, limits: Settings) -> LocalReader:
    """A reader on a ``readonly = 1`` connection with the read limits of ``limits``, in this process
    (cursor commits use another connection).

    On chDB, Arrow streams go through a second handle of the same engine with the same
    settings (:class:`~.chdbarrow.ChdbArrowStream`): the driver would materialise them whole.
    """
    settings = {**(_CHDB_READ_SETTINGS if dsn.embedded else {}), **read_settings(limits)}
    client = get_client(dsn=dsn, settings=settings)
    stream = None
    if dsn.embedded:
        from rewardflow.clickhouse.chdbarrow import ChdbArrowStream

        assert dsn.path is not None
        stream = ChdbArrowStream(dsn.path, dsn.database, settings, max_block_bytes=limits.read_max_block_bytes)
    return LocalReader(client, dsn.masked(), partial(get_client, dsn=dsn), stream)


def endpoint_url(settings: Settings) -> str:
    """The owner's read endpoint base URL, from ``web_host`` / ``web_port`` (https with a certificate)."""
    host = settings.web_host if ":" not in settings.web_host else f"[{settings.web_host}]"
    if host in ("0.0.0.0", "[::]"):  # a wildcard bind is reached on loopback from this machine
        host = "127.0.0.1"
    scheme = "https" if settings.web_tls_certfile is not None else "http"
    return f"{scheme}://{host}:{settings.web_port}"


def client_token(settings: Settings) -> str | None:
    """The bearer token this process presents: ``read_token``, else the owner's local token file
    (readable only by the user the owner runs as), else None."""
    if settings.read_token is not None:
        return settings.read_token.get_secret_value()
    return read_local_token(settings.home)


def open_reader(
    settings: Settings, *, dsn: str | Dsn | None = None, database: str | None = None, probe_timeout: float = 2.0
) -> Reader:
    """A :class:`Reader` for ``dsn`` (default ``settings.dsn``), chosen as the module doc says.

    Raises :class:`ReaderUnavailable` (one line, no traceback needed) when the
    chDB directory is owned by a process whose read endpoint does not answer.
    """
    target = as_dsn(dsn or settings.dsn).with_database(database)
    if not target.embedded:
        return local_reader(target, settings)
    assert target.path is not None
    owner = probe_engine(target.path)
    if owner is None or owner.this_process:
        try:
            return local_reader(target, settings)
        except EngineBusyError:
            pass  # lost a race with a starting owner: fall through to its endpoint
    url = endpoint_url(settings)
    if endpoint_alive(url, timeout=probe_timeout, cafile=settings.web_tls_certfile):
        return RemoteReader(url, token=client_token(settings), database=target.database,
                            cafile=settings.web_tls_certfile)
    pid = owner.pid if owner is not None and owner.pid else "another process"
    raise ReaderUnavailable(
        f"chDB directory {target.path} is owned by process {pid} and its read endpoint {url} does not answer: if "
        "that process serves on another port, set REWARDFLOW_WEB_PORT (and REWARDFLOW_WEB_HOST) as it has them; "
        "else start it with its read endpoint (rewardflow run serves one) or stop it, then retry"
    )


__all__ = ["ClickHouseError", "EngineBusyError", "ReaderUnavailable", "as_dsn", "get_client", "open_reader"]
