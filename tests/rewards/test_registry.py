"""Spec registry: directory loading, active selection, and the version ledger."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rewardflow.rewards.registry import (
    REWARD_SPECS_TABLE,
    SpecFile,
    active_specs,
    check_against_ledger,
    check_and_register,
    load_dir,
    select_active,
    specs_dir,
)
from rewardflow.rewards.spec import SpecError, bundled_specs_dir, load_spec
from rewardflow.settings import load_settings

V1 = (bundled_specs_dir() / "v1.toml").read_text()


def _write(d: Path, name: str, text: str) -> Path:
    p = d / name
    p.write_text(text)
    return p


def test_bundled_specs_load_sorted_with_v2_penalising_questions() -> None:
    files = load_dir(bundled_specs_dir())
    versions = [f.spec.version for f in files]
    assert versions[:2] == ["v1", "v2"] and versions == sorted(versions)
    v1, v2 = files[0].spec, files[1].spec
    assert v2.weights.clarifying < 0 == v1.weights.clarifying
    assert v2.weights.model_dump(exclude={"clarifying"}) == v1.weights.model_dump(exclude={"clarifying"})


def test_example_specs_are_valid() -> None:
    example_dir = Path(__file__).parents[2] / "examples" / "specs"
    assert [f.spec.version for f in load_dir(example_dir)]


def test_duplicate_version_in_directory_names_both_files(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.toml", V1)
    b = _write(tmp_path, "b.toml", V1.replace("latency_per_s = -0.02", "latency_per_s = -0.03"))
    with pytest.raises(SpecError, match="declared twice") as exc:
        load_dir(tmp_path)
    assert str(a) in str(exc.value) and str(b) in str(exc.value)


def test_empty_or_missing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no reward spec files"):
        load_dir(tmp_path)
    with pytest.raises(SpecError, match="not a directory"):
        load_dir(tmp_path / "nope")


def test_active_specs_honours_settings(tmp_path: Path) -> None:
    _write(tmp_path, "v1.toml", V1)
    _write(tmp_path, "v9.toml", V1.replace('version = "v1"', 'version = "v9"'))
    assert [s.version for s in active_specs(load_settings(reward_specs_dir=tmp_path))] == ["v1", "v9"]
    chosen = active_specs(load_settings(reward_specs_dir=tmp_path, active_spec_versions=["v9", "v1"]))
    assert [s.version for s in chosen] == ["v9", "v1"]
    assert specs_dir(load_settings()) == bundled_specs_dir()


def test_unknown_active_version_is_a_clear_error() -> None:
    files = load_dir(bundled_specs_dir())
    with pytest.raises(SpecError, match=r"\['v7'\] not found; known versions: \['v1', 'v2'"):
        select_active(files, ["v1", "v7"])


def test_ledger_refuses_a_changed_spec_under_the_same_version(tmp_path: Path) -> None:
    original = load_spec(_write(tmp_path, "v1.toml", V1))
    changed_path = _write(tmp_path, "v1.toml", V1.replace("tool_broken = -0.5", "tool_broken = -0.4"))
    changed = SpecFile(load_spec(changed_path), changed_path)
    ledger = {"v1": original.content_hash}
    check_against_ledger([SpecFile(original, changed_path)], ledger)  # unchanged: fine
    check_against_ledger([changed], {})  # unknown version: new, fine
    with pytest.raises(SpecError) as exc:
        check_against_ledger([changed], ledger)
    msg = str(exc.value)
    assert str(changed_path) in msg and original.content_hash in msg and changed.spec.content_hash in msg
    assert original.content_hash != changed.spec.content_hash


def test_content_hash_ignores_formatting_but_not_weights(tmp_path: Path) -> None:
    a = load_spec(_write(tmp_path, "a.toml", V1))
    b = load_spec(_write(tmp_path, "b.toml", "# reformatted\n" + V1.replace(" = ", "=")))
    assert a.content_hash == b.content_hash


class FakeClient:
    """Records inserts; answers the ledger query from them (no ClickHouse)."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []
        self.tokens: list[str] = []
        self.commands = 0

    def query(self, query: str, parameters: Mapping[str, Any] | None = None) -> Any:
        assert REWARD_SPECS_TABLE.name in query
        return type("R", (), {"result_rows": sorted({(r[0], r[1]) for r in self.rows})})()

    def command(self, cmd: str) -> Any:
        assert cmd.startswith("CREATE TABLE IF NOT EXISTS `reward_specs`")
        self.commands += 1

    def insert(self, table: str, data: Sequence[Sequence[Any]], column_names: Sequence[str],
               settings: Mapping[str, Any] | None = None) -> Any:
        assert table == "reward_specs" and list(column_names) == list(REWARD_SPECS_TABLE.record_columns)
        assert all(len(r) == len(column_names) for r in data)
        self.rows.extend(list(r) for r in data)
        self.tokens.append(str((settings or {})["insert_deduplication_token"]))


def test_check_and_register_is_idempotent_and_refuses_changes(tmp_path: Path) -> None:
    client = FakeClient()
    files = load_dir(bundled_specs_dir())
    assert check_and_register(client, files) == [f.spec.version for f in files]
    assert check_and_register(client, files) == []
    assert len(client.rows) == len(files)
    bad = _write(tmp_path, "v1.toml", V1.replace("accept = 0.5", "accept = 0.6"))
    with pytest.raises(SpecError, match="can never change"):
        check_and_register(client, [SpecFile(load_spec(bad), bad)])
    assert len(client.rows) == len(files)
