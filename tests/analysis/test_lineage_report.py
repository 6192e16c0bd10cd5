"""Each arm's lineage in the A/B report: terminal, HTML, JSON, and ``rewardflow compare`` on ClickHouse."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

from rewardflow.analysis.ab import compare
from rewardflow.analysis.render import lineage_table
from rewardflow.analysis.report_html import write_report
from rewardflow.cli.main import app
from rewardflow.lineage.registry import Checkpoint, Registry
from rewardflow.lineage.store import CheckpointStore
from tests.analysis.conftest import BASE, CAND, synthetic_rows
from tests.conftest_clickhouse import ChDatabase

T = 1_748_764_800_000  # 2025-06-01T08:00:00Z
ROWS = synthetic_rows(BASE, 300, 1) + synthetic_rows(CAND, 300, 2)
REGISTRY = Registry({"root": Checkpoint("root", "", 0, T - 1), BASE: Checkpoint(BASE, "root", 1, T)})


def text_of(renderable: object) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


def test_the_terminal_table_shows_parent_generation_and_deployment_or_not_registered() -> None:
    report = compare(ROWS, BASE, CAND, registry=REGISTRY)
    assert report.lineage == {BASE: REGISTRY.get(BASE), CAND: None}
    text = text_of(lineage_table(report))
    base_line = next(line for line in text.splitlines() if BASE in line)
    cand_line = next(line for line in text.splitlines() if CAND in line)
    assert "baseline" in base_line and "root" in base_line and " 1 " in base_line and "2025-06-01T08:00:00.000Z" in base_line
    assert "candidate" in cand_line and "not registered" in cand_line


def test_without_a_registry_there_is_no_lineage_section_and_the_report_is_unchanged() -> None:
    plain = compare(ROWS, BASE, CAND)
    assert plain.lineage is None and lineage_table(plain) is None
    assert compare(ROWS, BASE, CAND, registry=Registry()).metrics == plain.metrics


def test_html_and_json_carry_the_lineage(tmp_path: Path) -> None:
    html_path, json_path = write_report(compare(ROWS, BASE, CAND, registry=REGISTRY), [], tmp_path)
    html = html_path.read_text()
    section = html[html.index("<h2>Policy lineage</h2>"):]
    section = section[:section.index("</table>")]
    assert f"<td>{BASE}</td><td>root</td><td>1</td><td>2025-06-01T08:00:00.000Z</td>" in section
    assert f"<td>{CAND}</td><td>not registered</td>" in section
    doc = orjson.loads(json_path.read_bytes())
    assert doc["report"]["lineage"][BASE]["parent_id"] == "root" and doc["report"]["lineage"][CAND] is None
    plain, _ = write_report(compare(ROWS, BASE, CAND), [], tmp_path / "plain")
    assert "Policy lineage" not in plain.read_text()


@pytest.mark.clickhouse
def test_compare_on_clickhouse_reads_the_registry(ch_db: ChDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.clickhouse.rows import insert, reward

    s = ch_db.settings()
    for k, v in {"REWARDFLOW_CLICKHOUSE_DSN": ch_db.dsn.secret, "REWARDFLOW_HOME": str(s.home)}.items():
        monkeypatch.setenv(k, v)
    insert(ch_db.client, [reward(i, checkpoint=BASE if i % 2 else CAND, reward_value=i % 3 / 3) for i in range(200)])
    CheckpointStore(ch_db.client).register(BASE, deployed_at_ms=T, note="prod")
    CheckpointStore(ch_db.client).register(CAND, BASE, T + 5 * 3_600_000)
    runner = CliRunner()
    table = runner.invoke(app, ["compare", "--baseline", BASE, "--candidate", CAND, "--html", str(tmp_path)])
    assert table.exit_code == 0, table.output
    cand_line = next(line for line in table.stdout.splitlines() if "candidate" in line and CAND in line)
    assert BASE in cand_line and "2025-06-01T13:00:00.000Z" in cand_line
    assert "policy lineage" in table.stdout
    assert "2025-06-01T13:00:00.000Z" in (tmp_path / "ab-report.html").read_text()
    as_json = runner.invoke(app, ["compare", "--baseline", BASE, "--candidate", CAND, "--json"])
    lineage = orjson.loads(as_json.stdout)["report"]["lineage"]
    assert lineage[BASE]["generation"] == 0 and lineage[CAND]["generation"] == 1 and lineage[CAND]["parent_id"] == BASE
