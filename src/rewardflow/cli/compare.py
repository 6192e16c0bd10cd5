"""``rewardflow compare``: the A/B report of a candidate checkpoint, and the deploy gate.

Reads final reward rows (``provisional = 0``, once per ``reward_id``) of both
checkpoints from ClickHouse (or from ``--rows-file``: Parquet or JSON lines of
reward rows), prints the report, and with ``--policy`` evaluates the gate.
From ClickHouse it also reads the checkpoint registry and shows each arm's lineage
(parent, generation, deployment time, or "not registered"); a rows file has none.

Exit codes: 0 report printed (gate passed, if any); 1 the gate failed;
2 usage or configuration error (bad policy, unreachable database, no rows),
always as one line on stderr.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

from rewardflow.analysis.ab import Report, compare
from rewardflow.analysis.gate import GateResult, Policy, PolicyError, evaluate, load_policy
from rewardflow.analysis.render import exclusion_table, gate_table, lineage_table, report_table
from rewardflow.analysis.rows import AnalysisError
from rewardflow.lineage.registry import Registry
from rewardflow.settings import Settings, load_settings


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def read_rows_file(path: Path) -> Any:
    """Reward rows from a Parquet file or a JSON-lines file (one row per line)."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path)
        return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot read rows from {path}: {str(exc).splitlines()[0]}") from None


def _rows(settings: Settings | None, rows_file: Path | None, checkpoints: list[str], spec: str | None) -> Any:
    if rows_file is not None:
        return read_rows_file(rows_file)
    from rewardflow.analysis.source import SourceError, fetch_rewards

    assert settings is not None
    try:
        return fetch_rewards(settings, checkpoints, spec)
    except SourceError as exc:
        raise _fail(str(exc)) from None


def _registry(settings: Settings | None) -> Registry | None:
    if settings is None:
        return None
    from rewardflow.analysis.source import SourceError, fetch_registry

    try:
        return fetch_registry(settings)
    except SourceError as exc:
        raise _fail(str(exc)) from None


def _exclusions(settings: Settings | None) -> Any:
    """Each checkpoint's excluded turns (None for rows read from a file)."""
    if settings is None:
        return None
    from rewardflow.analysis.source import SourceError, fetch_balance

    try:
        return fetch_balance(settings).overall
    except SourceError as exc:
        raise _fail(str(exc)) from None


def _html(settings: Settings | None, out_dir: Path, report: Report, gate: GateResult | None, console: Console) -> None:
    from rewardflow.analysis.report_html import write_report
    from rewardflow.analysis.source import SourceError, fetch_windows

    windows: Any = []
    if settings is not None:
        try:
            windows = fetch_windows(settings, [report.baseline, report.candidate], report.spec_version)
        except SourceError as exc:
            raise _fail(str(exc)) from None
    html_path, json_path = write_report(report, windows, out_dir, gate=gate)
    console.print(f"report written to {html_path} and {json_path}")


def command(
    baseline: Annotated[str, typer.Option(help="Baseline checkpoint id (production).")],
    candidate: Annotated[str, typer.Option(help="Candidate checkpoint id.")],
    policy: Annotated[Path | None, typer.Option(help="Gate policy TOML (`default`: the shipped example gate); exit 1 when a rule fails.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report (and gate) as JSON.")] = False,
    spec_version: Annotated[str | None, typer.Option(help="Reward spec version (default: the first active one, as rewardflow audit; with --rows-file, the highest in the file).")] = None,
    confidence: Annotated[float, typer.Option(min=0.5, max=0.999, help="Confidence of the report's intervals.")] = 0.95,
    html: Annotated[Path | None, typer.Option(help="Also write ab-report.html and ab-report.json into this directory.")] = None,
    rows_file: Annotated[Path | None, typer.Option(help="Read reward rows from this Parquet / JSON-lines file, not ClickHouse.")] = None,
) -> None:
    """Compare a candidate checkpoint with the baseline; optionally gate the deploy."""
    gate_policy: Policy | None = None
    if policy is not None:
        try:
            gate_policy = load_policy(policy)
        except PolicyError as exc:
            raise _fail(str(exc)) from None
    settings = None if rows_file is not None else load_settings()
    if settings is not None and spec_version is None:
        from rewardflow.rewards.registry import active_specs
        from rewardflow.rewards.spec import SpecError

        try:
            spec_version = active_specs(settings)[0].version
        except SpecError as exc:
            raise _fail(str(exc)) from None
    rows = _rows(settings, rows_file, [baseline, candidate], spec_version)
    try:
        report = compare(rows, baseline, candidate, spec_version=spec_version, confidence=confidence,
                         registry=_registry(settings), exclusions=_exclusions(settings))
    except AnalysisError as exc:
        raise _fail(str(exc)) from None
    gate = evaluate(report, gate_policy) if gate_policy is not None else None
    err = Console(stderr=True)
    if json_out:
        doc = {"report": report.to_dict(), "gate": asdict(gate) if gate is not None else None}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n")
    else:
        out = Console(width=None if sys.stdout.isatty() else 132)
        out.print(report_table(report))
        if (lineage := lineage_table(report)) is not None:
            out.print(lineage)
        if (excluded := exclusion_table(report)) is not None:
            out.print(excluded)
        if gate is not None:
            out.print(gate_table(gate))
    if html is not None:
        _html(settings, html, report, gate, err)
    if gate is not None and not gate.passed:
        raise typer.Exit(1)
