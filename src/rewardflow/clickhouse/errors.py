"""Errors of the ClickHouse layer, and turning driver errors into one clean line.

Every message here is safe to print: DSNs appear masked, never with a password.
"""

from __future__ import annotations

import re

from clickhouse_connect.driver.exceptions import ClickHouseError as DriverError
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError


class ClickHouseError(RuntimeError):
    """Base of rewardflow's ClickHouse errors."""


class EngineBusyError(ClickHouseError):
    """The chDB directory is open in another process (one process per path)."""


class ReaderUnavailable(ClickHouseError):
    """No way to read: the chDB path is owned elsewhere and its owner's read endpoint does not answer."""


class AccessDenied(ClickHouseError):
    """The read endpoint refused the token (missing, unknown, revoked) or its role may not do this."""


class WriteRefused(ClickHouseError):
    """The owner's endpoint refused a write that contradicts what is stored (HTTP 409); ``str()`` says why."""


class ClickHouseUnavailable(ClickHouseError):
    """ClickHouse cannot take writes right now (down, unreachable, overloaded); retry later."""


class QueryError(ClickHouseError):
    """ClickHouse refused a query; ``str()`` is ClickHouse's own message, cleaned to one line."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


_CODE = re.compile(r"Code: (\d+)\. ")
_DUP = re.compile(r"^(Code: \d+\. DB::Exception: )+")
_TRAILER = re.compile(r"\s*\(version [^)]*\)\.?.*$", re.DOTALL)

# Errors that mean "this data is wrong" (the same rows will fail again), as
# opposed to "the server cannot take it now" (retrying will succeed later).
DATA_ERROR_CODES = frozenset(
    {6, 25, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 131, 190, 349, 352, 353, 354, 467, 469}
)


def error_code(exc: BaseException) -> int | None:
    """ClickHouse error code of a driver exception, if it carries one."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    match = _CODE.search(str(exc))
    return int(match.group(1)) if match else None


def clean_message(exc: BaseException) -> str:
    """ClickHouse's message without repeated ``Code: N. DB::Exception:`` prefixes or version trailer."""
    text = str(exc).strip()
    idx = text.find("Code: ")
    if idx > 0:
        text = text[idx:]
    code = error_code(exc)
    body = _TRAILER.sub("", _DUP.sub("", text)).strip()
    body = re.sub(r"\s*\n\s*", " ", body)
    if code in (60, 81) and re.search(r"(table|database)\b.*\b(rewards|events|reward_windows|trainer_cursors|ingest_keys|"
                                      r"checkpoints|dead_letters|late_events|exclusions|alerts|rewardflow)\b", body, re.I):
        body += (" (the rewardflow tables are created by `rewardflow db migrate`, which `rewardflow run` "
                 "also does at start)")
    return f"Code {code}: {body}" if code is not None else body


def is_data_error(exc: BaseException) -> bool:
    """True when ClickHouse rejected the *data* (retrying the same rows cannot succeed)."""
    return isinstance(exc, DatabaseError) and not isinstance(exc, OperationalError) and error_code(exc) in DATA_ERROR_CODES


def is_driver_error(exc: BaseException) -> bool:
    """True for any clickhouse-connect error."""
    return isinstance(exc, DriverError)
