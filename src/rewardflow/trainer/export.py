"""Write a trainer pull to a Parquet file, atomically.

Contract of :func:`export_parquet`: the rows of one :class:`RewardReader`
iteration are written to ``<out>.partial`` and renamed to ``out`` only after
the file is complete and synced; ``<out>.lock`` is locked for the whole export, cursor commit
included, and a second export to the same file stops at once (:class:`ExportInProgress`); the reader's cursor is committed only after
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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    reader: RewardReader, out: Path, *, commit: bool, on_batch: Callable[[int], None] | None = None,
    keep_existing: bool = False,
) -> ExportResult:
    """Stream the reader's next rows into ``out`` (zstd Parquet); see the module contract.
    ``keep_existing``: raise ``FileExistsError`` when ``out`` exists (checked under the lock)."""
    started = time.perf_counter()
    partial, previous = out.with_name(out.name + ".partial"), out.with_name(out.name + ".previous")
    with _locked(out):
        if keep_existing and out.exists():
            raise FileExistsError(f"{out} exists")
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
            fh.close()
            if commit and out.exists():  # (an --overwrite: kept until the cursor has moved past the new rows)
                os.replace(out, previous)
            os.replace(partial, out)
        finally:
            try:
                if writer is not None:
                    writer.close()
            finally:
                fh.close()
                partial.unlink(missing_ok=True)
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


@contextmanager
def _locked(out: Path) -> Iterator[None]:
    """Hold ``<out>.lock`` (``flock``, exclusive) for the whole export: another export to ``out`` stops at
    once (:class:`ExportInProgress`). The lock file stays (removing it would let two exports lock two files)."""
    path = out.with_name(out.name + ".lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ExportInProgress(out) from None
        yield
    finally:
        os.close(fd)


def _create(path: Path) -> BinaryIO:
    """A new file at ``path``, open for writing. Whatever is there (a file a crash left, a symlink) is
    removed first, and the file is created exclusively, never through a symlink: one planted in a
    directory others may write to would have the export overwrite the file it points to."""
    path.unlink(missing_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    return os.fdopen(os.open(path, flags, 0o644), "wb")


class ExportInProgress(RuntimeError):
    """Another export is writing the same file."""

    def __init__(self, out: Path) -> None:
        super().__init__(f"another export is writing {out} now: wait for it to end, or export to another file")
