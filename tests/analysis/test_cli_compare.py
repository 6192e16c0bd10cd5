"""``rewardflow compare`` over a rows file: report, gate exit codes, one-line errors."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from rewardflow.cli.main import app
from tests.analysis.conftest import BASE, CAND, synthetic_rows
from tests.analysis.test_gate import EXAMPLE

runner = CliRunner()


def _rows_file(tmp_path: Path, persist_candidate: float) -> Path:
    rows = synthetic_rows(BASE, 1_500, 1, persist=0.7) + synthetic_rows(CAND, 1_500, 2, persist=persist_candidate)
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(r, option=orjson.OPT_NON_STR_KEYS) for r in rows))
    return path


def _compare(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["compare", "--baseline", BASE, "--candidate", CAND, *args])
    return result.exit_code, result.stdout, result.stderr


def test_report_json_and_gate_pass(tmp_path: Path) -> None:
    code, out, _ = _compare("--rows-file", str(_rows_file(tmp_path, 0.72)), "--json", "--policy", str(EXAMPLE))
    assert code == 0, out
    doc = orjson.loads(out)
    assert doc["report"]["candidate"] == CAND and doc["gate"]["passed"] is True
    assert doc["report"]["metrics"]["persistence_rate"]["n_candidate"] == 1_500


def test_gate_failure_exits_1_and_names_the_rule(tmp_path: Path) -> None:
    code, out, _ = _compare("--rows-file", str(_rows_file(tmp_path, 0.55)), "--policy", str(EXAMPLE))
    assert code == 1
    assert "FAIL" in out and "persistence_rate" in out


def test_html_from_rows_file(tmp_path: Path) -> None:
    code, _, err = _compare("--rows-file", str(_rows_file(tmp_path, 0.7)), "--html", str(tmp_path / "out"))
    assert code == 0
    assert (tmp_path / "out" / "ab-report.html").is_file() and "report written" in err


def test_usage_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[rule]]\nmetric = "nope"\nmax_drop_pct = 1\n')
    rows = str(_rows_file(tmp_path, 0.7))
    for args, needle in (
        (["--rows-file", rows, "--policy", str(bad)], "unknown metric"),
        (["--rows-file", rows, "--spec-version", "v9"], "no final reward rows under spec"),
        (["--rows-file", str(tmp_path / "absent.jsonl")], "cannot read rows"),
    ):
        code, _, err = _compare(*args)
        assert code == 2, args
        assert err.startswith("error: ") and needle in err and err.count("\n") == 1
