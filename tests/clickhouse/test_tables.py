"""The generated record TypedDicts agree with the table definitions (names, order, types). Pure."""

from __future__ import annotations

import typing

import pytest

from rewardflow.clickhouse.catalog import ALL_TABLES, SINK_TABLES, table_of_topic
from rewardflow.clickhouse.columns import TableDef
from rewardflow.clickhouse.ddl import create_table
from rewardflow.core import rows
from rewardflow.kafka.topics import TABLE_OF_TOPIC

_SCALAR = {
    str: ("String", "LowCardinality(String)"),
    int: ("UInt8", "UInt16", "UInt32", "UInt64", "Int32", "Int64"),
    float: ("Float64",),
}


def _compatible(py: object, ch: str) -> bool:
    if typing.get_origin(py) is dict:
        key, value = typing.get_args(py)
        if not (ch.startswith("Map(") and ch.endswith(")")):
            return False
        ch_key, ch_value = (part.strip() for part in ch[4:-1].split(",", 1))
        return _compatible(key, ch_key) and _compatible(value, ch_value)
    return ch in _SCALAR.get(py, ())  # type: ignore[call-overload]


@pytest.mark.parametrize("table", SINK_TABLES, ids=lambda t: t.name)
def test_record_columns_are_the_typeddict_fields_in_order(table: TableDef) -> None:
    hints = typing.get_type_hints(getattr(rows, table.record))
    assert table.record_columns == tuple(hints)


@pytest.mark.parametrize("table", SINK_TABLES, ids=lambda t: t.name)
def test_column_types_fit_the_python_types(table: TableDef) -> None:
    hints = typing.get_type_hints(getattr(rows, table.record))
    wrong = {n: (hints[n], table.column(n).type) for n in hints if not _compatible(hints[n], table.column(n).type)}
    assert not wrong


def test_every_output_topic_has_a_table_with_an_id_column() -> None:
    for topic, name in TABLE_OF_TOPIC.items():
        t = table_of_topic(topic)
        assert t.name == name
        assert t.id_column in t.record_columns


def test_late_events_and_exclusions_share_one_column_definition() -> None:
    late, excl = table_of_topic("late"), table_of_topic("exclusions")
    assert late.columns is excl.columns


@pytest.mark.parametrize("table", ALL_TABLES, ids=lambda t: t.name)
def test_every_table_and_column_is_documented_and_renders(table: TableDef) -> None:
    assert table.doc
    assert all(c.doc for c in table.columns)
    ddl = create_table(table, events_ttl_days=7)
    assert ddl.startswith(f"CREATE TABLE IF NOT EXISTS `{table.name}`")
    if "{events_ttl_days}" in table.ttl:
        assert "INTERVAL 7 DAY" in ddl


@pytest.mark.parametrize("table", SINK_TABLES, ids=lambda t: t.name)
def test_sink_tables_dedup_inserts_and_carry_a_cursor_column(table: TableDef) -> None:
    assert int(table.settings["non_replicated_deduplication_window"]) > 0
    assert table.column("_seq").expr == "generateSnowflakeID()"
    assert table.engine.startswith("ReplacingMergeTree")


@pytest.mark.parametrize("table", SINK_TABLES, ids=lambda t: t.name)
def test_partition_keys_never_use_wall_time(table: TableDef) -> None:
    # copies of a key must share a partition, or neither merges nor FINAL can collapse them
    assert not any(col in table.partition_by for col in ("dead_lettered_at", "raised_at", "_inserted_at", "_seq"))
