"""``rewardflow bench``: run the benchmark scripts under ``bench/`` (produce, stream, sink, e2e, faust_path, collect) and summarise.

The scripts live in the source checkout (``bench/``, next to ``src/``), not in
the installed package; this command finds them from the package location or
the current directory and runs ``bench/run_all.py`` with this interpreter.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer


def _bench_dir() -> Path | None:
    here = Path(__file__).resolve()
    for base in (*here.parents, Path.cwd()):
        cand = base / "bench" / "run_all.py"
        if cand.is_file():
            return cand.parent
    return None


def command(
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON (bench/results/summary.json)."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes and one run each (minutes instead of an hour)."),
    only: str | None = typer.Option(None, "--only", help="Run only these: comma-separated of produce, stream, sink, e2e, faust_path, collect."),
) -> None:
    """Run the benchmarks in sequence (each beside its floor) and print one summary table.

    Results: bench/results/<name>.json per script and bench/results/summary.json.
    """
    bench = _bench_dir()
    if bench is None:
        typer.echo("error: bench/run_all.py not found; run from a rewardflow source checkout", err=True)
        raise typer.Exit(2)
    cmd = [sys.executable, str(bench / "run_all.py")]
    if json_out:
        cmd.append("--json")
    if quick:
        cmd.append("--quick")
    if only:
        cmd += ["--only", only]
    raise typer.Exit(subprocess.call(cmd))
