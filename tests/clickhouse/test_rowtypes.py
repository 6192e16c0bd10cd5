"""The record TypedDicts are generated from the table definitions; a stale module stops migrations. Pure."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rewardflow.clickhouse import rowtypes
from rewardflow.clickhouse.catalog import ALL_TABLES
from rewardflow.clickhouse.columns import Column
from rewardflow.clickhouse.migrate import migrate
from rewardflow.clickhouse.tables import REWARDS
from rewardflow.core import rows


def test_the_committed_rows_are_the_generators_output() -> None:
    assert Path(rows.__file__).read_text() == rowtypes.render(ALL_TABLES)


@pytest.mark.parametrize(
    ("ch", "py"),
    [("String", "str"), ("LowCardinality(String)", "str"), ("UInt8", "int"), ("Int64", "int"),
     ("Float64", "float"), ("Map(UInt32, Float64)", "dict[int, float]"), ("Map(String, UInt64)", "dict[str, int]")],
)
def test_clickhouse_types_map_to_python(ch: str, py: str) -> None:
    assert rowtypes.py_type(ch, "t.c") == py


def test_a_type_without_a_python_mapping_names_the_column() -> None:
    with pytest.raises(ValueError, match="rewards.when: no Python type for ClickHouse type 'DateTime'"):
        rowtypes.py_type("DateTime", "rewards.when")


def _with_extra_column() -> tuple:  # type: ignore[type-arg]
    changed = dataclasses.replace(REWARDS, columns=(*REWARDS.columns, Column("extra", "UInt32", "An extra column.")))
    return tuple(changed if t is REWARDS else t for t in ALL_TABLES)


def test_a_new_column_changes_the_generated_record() -> None:
    text = rowtypes.render(_with_extra_column())
    assert "    extra: int\n" in text and text != rowtypes.render(ALL_TABLES)
    with pytest.raises(rowtypes.RowTypesStale, match="run `rewardflow codegen`"):
        rowtypes.check(_with_extra_column())


def test_migrate_refuses_before_touching_the_database_when_rows_are_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    import rewardflow.clickhouse.migrate as m

    monkeypatch.setattr(m, "ALL_TABLES", _with_extra_column())
    with pytest.raises(rowtypes.RowTypesStale):
        migrate(client=None)  # type: ignore[arg-type]  # refused before the client is used
