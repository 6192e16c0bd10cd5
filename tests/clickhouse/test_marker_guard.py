"""Marking is enforced: an unmarked test touching ClickHouse fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_unmarked_tests_touching_clickhouse_fail(tmp_path: Path) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from rewardflow.clickhouse.connect import get_client\n"
        "def test_direct():\n    get_client(dsn='chdb:///nonexistent/never')\n"
        "def test_fixture(ch_db):\n    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest_clickhouse", "-p", "no:cacheprovider", str(probe),
         "--rootdir", str(ROOT)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert "1 failed, 1 error" in result.stdout, result.stdout  # the fixture case fails at setup
    assert "opened a ClickHouse client but is not marked @pytest.mark.clickhouse" in result.stdout
    assert "uses ClickHouse (ch_db, ch_dsn) but is not marked @pytest.mark.clickhouse" in result.stdout
