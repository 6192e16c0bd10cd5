"""Write a trainer pull to a Parquet file, atomically.

Contract of :func:`export_parquet`: the rows of one :class:`RewardReader`
iteration are written to ``<out>.partial`` and renamed to ``out`` only after
the file is complete and synced; the partial file is locked while it is written, and a second
export to the same file stops at once (:class:`ExportInProgress`) instead of taking it over; the reader's cursor is committed only after
that rename (when ``commit``). So a crash leaves either no file and no cursor
move, or the whole file and possibly no cursor move (the next export repeats
those rows) - never a cursor past rows that are not in a file. A token that may not move the cursor
(:class:`~rewardflow.clickhouse.errors.AccessDenied`) leaves no new file either: a file it was to
replace is put back (kept as ``<out>.previous`` until the cursor has moved).

The file has the reader's columns: the record columns, ``_seq`` and the lineage columns
(:mod:`rewardflow.lineage.columns`); the reader's filters, ``max_policy_lag`` among them, decide
its rows.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow.parquet as pq

from rewardflow.clickhouse.errors import AccessDenied
from rewardflow.trainer.reader import RewardReader


@dataclass(frozen=True)
class ExportResult:
    """What was written."""

    rows: int
    path: Path
    bytes: int
    seconds: float
    cursor: int | None


def export_parquet(
    reader: RewardReader, out: Path, *, commit: bool, on_batch: Callable[[int], None] | None = None
) -> ExportResult:
    """Stream the reader's next rows into ``out`` (zstd Parquet); see the module contract."""
    started = time.perf_counter()
    partial, previous = out.with_name(out.name + ".partial"), out.with_name(out.name + ".previous")
    rows = 0
    writer: pq.ParquetWriter | None = None
    fh = _create(partial)
    try:
        for batch in reader:
            if writer is None:
                writer = pq.ParquetWriter(fh, batch.schema, compression="zstd")
            writer.write_batch(batch)
            rows += batch.num_rows
            if on_batch is not None:
                on_batch(batch.num_rows)
        if writer is None:
            writer = pq.ParquetWriter(fh, reader.schema(), compression="zstd")
        writer.close()
        writer = None
        fh.flush()
        os.fsync(fh.fileno())
        if commit and out.exists():  # (an --overwrite: kept until the cursor has moved past the new rows)
            os.replace(out, previous)
        os.replace(partial, out)  # (still locked: no other export removed or replaced it)
        fh.close()
    finally:
        try:
            if writer is not None:
                writer.close()
        finally:
            if not fh.closed and _ours(partial, fh):  # (never another export's file, once ours was renamed)
                partial.unlink()
            fh.close()
    try:
        cursor = reader.commit() if commit else None
    except AccessDenied:  # the cursor stayed where it was: the new rows are not behind it, and a retry writes them
        if previous.exists():
            os.replace(previous, out)  # the file it replaced is back: its rows are behind the cursor
        else:
            out.unlink()
        raise
    if previous.exists():
        previous.unlink()
    return ExportResult(rows, out, out.stat().st_size, time.perf_counter() - started, cursor)


def _create(path: Path) -> BinaryIO:
    """A new file at ``path``, open for writing and locked (``flock``) until it is closed. A file there that another export holds locked stops this one
    (:class:`ExportInProgress`); anything else there (a file a crash left, a symlink) is removed first,
    and the file is created exclusively, never through a symlink: one planted in a directory others
    may write to would have the export overwrite the file it points to."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    _refuse_if_locked(path)
    path.unlink(missing_ok=True)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise ExportInProgress(path) from None
    fh = os.fdopen(fd, "wb")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _ours(path, fh):  # removed by another export before the lock was taken
            raise ExportInProgress(path)
    except BaseException:
        fh.close()
        raise
    return fh


def _refuse_if_locked(path: Path) -> None:
    """Raise :class:`ExportInProgress` when a regular file at ``path`` is locked by another export."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return  # nothing there, or a symlink (removed next), or what cannot be opened (removed next)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise ExportInProgress(path) from None
    finally:
        os.close(fd)


def _ours(path: Path, fh: BinaryIO) -> bool:
    """Whether ``path`` names the file open as ``fh`` (not one another export put there since)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(fh.fileno()).st_ino
    except FileNotFoundError:
        return False


class ExportInProgress(RuntimeError):
    """Another export is writing the same file."""

    def __init__(self, partial: Path) -> None:
        super().__init__(f"another export is writing {partial} now: wait for it to end, or export to another file")
