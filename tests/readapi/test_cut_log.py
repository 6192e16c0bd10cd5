"""A query cut off after its answer began is logged as one line, whatever wraps its exception."""

from __future__ import annotations

import logging
import sys

from rewardflow.readapi.stream import OneLineCuts, StreamCut


def record(exc: BaseException) -> logging.LogRecord:
    try:
        raise exc
    except BaseException:  # noqa: BLE001
        info = sys.exc_info()
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "Exception in ASGI application", (), info)


def test_a_cut_is_one_line_alone_or_in_a_group_and_other_errors_keep_their_traceback() -> None:
    cut = StreamCut("the query failed after its answer began: boom")
    for exc in (cut, BaseExceptionGroup("unhandled errors in a TaskGroup", [cut])):
        r = record(exc)
        assert OneLineCuts().filter(r) and r.exc_info is None
        assert r.getMessage() == "read query cut off: the query failed after its answer began: boom"
    other = record(RuntimeError("something else"))
    assert OneLineCuts().filter(other) and other.exc_info is not None
