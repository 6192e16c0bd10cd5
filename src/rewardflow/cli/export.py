"""``rewardflow export --checkpoint C [--spec-version V] [--trainer NAME] --out rewards.parquet``.

Without ``--trainer``: a snapshot of every final reward of the checkpoint.
With ``--trainer``: only rows newer than that trainer's cursor, and the cursor
advances once the file is complete (see :mod:`rewardflow.trainer.export`), so
repeated exports hand each sample to the trainer exactly once. An existing ``--out``
holds rows the trainer's cursor has passed: it is replaced only with ``--overwrite``.
A checkpoint scored by several reward spec versions has a row per sample and version:
without ``--spec-version`` the export is refused unless ``--all-specs`` asks for every version. Works while the
pipeline runs (a busy chDB directory is read through its owner's endpoint).
Every row carries its checkpoint's lineage (``policy_generation``, ``policy_age_s``,
``policy_lag``); ``--max-policy-lag N`` exports only rows of registered checkpoints at most N
generations behind the newest one, and the rows it skips are behind the trainer's cursor afterwards.
A ``--spec-version`` or ``--checkpoint`` that is not registered and is on no stored row is refused;
when no reward at all matches the filters, the trainer's cursor is not moved.
Exit codes: 0 done; 2 a fixable error, one ``error:`` line on stderr.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rewardflow.clickhouse.errors import ClickHouseError, clean_message, is_driver_error
from rewardflow.settings import load_settings
from rewardflow.trainer.export import ExportInProgress, export_parquet
from rewardflow.trainer.reader import RewardReader, UnknownCheckpoint, UnknownSpecVersion


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def command(
    checkpoint: Annotated[str, typer.Option("--checkpoint", help="Checkpoint whose rewards to export.")],
    out: Annotated[Path, typer.Option("--out", help="Parquet file to write (replaced atomically).")],
    spec_version: Annotated[str | None, typer.Option("--spec-version", help="Only this reward spec version.")] = None,
    trainer: Annotated[str | None, typer.Option("--trainer", help="Export only rows new to this trainer, then advance its cursor.")] = None,
    all_specs: Annotated[bool, typer.Option(
        "--all-specs", help="Without --spec-version, export every spec version's row of each sample.")] = False,
    overwrite: Annotated[bool, typer.Option(
        "--overwrite", help="With --trainer, replace an existing --out (its rows are behind the cursor).")] = False,
    include_provisional: Annotated[bool, typer.Option("--include-provisional", help="Also export provisional outcomes.")] = False,
    settle: Annotated[float, typer.Option("--settle", help="Seconds a row must be old to be exported (trainer mode).")] = 10.0,
    max_policy_lag: Annotated[int | None, typer.Option(
        "--max-policy-lag", min=0,
        help="Only rows of registered checkpoints at most this many generations behind the newest "
             "(rewardflow checkpoints); skipped rows are behind the trainer's cursor afterwards.")] = None,
) -> None:
    """Export reward records to Parquet, with a progress bar and the final count."""
    settings = load_settings()
    console = Console(stderr=True)
    exists = (f"{out} exists, and its rows are behind trainer {trainer!r}'s cursor: train on it and move it away "
              "first, or pass --overwrite")
    if trainer is not None and out.exists() and not overwrite:
        raise _fail(exists)
    try:
        reader = RewardReader(
            trainer=trainer, checkpoint=checkpoint, spec_version=spec_version,
            only_final=not include_provisional, max_policy_lag=max_policy_lag,
            settle_s=settle if trainer else 0.0, settings=settings,
        )
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:
        if not is_driver_error(exc):
            raise
        raise _fail(f"cannot connect to ClickHouse: {clean_message(exc)}") from None
    try:
        versions = reader.spec_versions()
        if not versions:
            kept = f"; the cursor of trainer {trainer!r} is not moved" if trainer else ""
            typer.echo(f"note: no reward matches checkpoint {checkpoint!r}"
                       f"{f' and spec version {spec_version!r}' if spec_version else ''} "
                       f"(rewardflow sql \"SELECT DISTINCT checkpoint_id, spec_version FROM rewards\" lists them){kept}",
                       err=True)
        if spec_version is None and not all_specs and len(versions) > 1:
            raise _fail(f"checkpoint {checkpoint!r} has rewards of {len(versions)} spec versions "
                        f"({', '.join(versions)}), a row per sample and version: pass --spec-version "
                        f"{versions[-1]}, say, or --all-specs for every version's rows")
        total = reader.count_new()
        columns = (TextColumn("exporting"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("export", total=total)
            result = export_parquet(reader, out, commit=trainer is not None and bool(versions),
                                    keep_existing=trainer is not None and not overwrite,
                                    on_batch=lambda n: progress.advance(task, n))
    except (UnknownSpecVersion, UnknownCheckpoint, ExportInProgress) as exc:
        raise _fail(str(exc)) from None
    except ClickHouseError as exc:
        raise _fail(str(exc)) from None
    except FileExistsError:  # (another export wrote it meanwhile)
        raise _fail(exists) from None
    except OSError as exc:
        raise _fail(f"cannot write {out}: {exc}") from None
    finally:
        reader.close()
    rate = result.rows / result.seconds if result.seconds > 0 else 0.0
    cursor = f"; trainer {trainer!r} cursor now {result.cursor}" if result.cursor is not None else ""
    typer.echo(f"exported {result.rows:,} rows to {result.path} ({result.bytes / 1e6:.1f} MB, {rate:,.0f} rows/s){cursor}")
