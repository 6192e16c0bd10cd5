"""RewardSpec: validation, the broken-tool-call rule, content hashes, TOML load errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from rewardflow.rewards.spec import RewardSpec, RewardWeights, SpecError, bundled_specs_dir, load_spec

V1_TOML = """
version = "v1"
description = "test"

[weights]
persistence = 1.0
tool_broken = -0.5
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_specs_load_and_penalise_broken_tool_calls() -> None:
    paths = sorted(bundled_specs_dir().glob("*.toml"))
    assert paths, "no bundled spec"
    for path in paths:
        spec = load_spec(path)
        assert spec.version == path.stem
        assert spec.weights.tool_broken < 0


def test_a_spec_file_with_only_some_weights_gets_the_defaults_for_the_rest(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, V1_TOML))
    assert spec.version == "v1" and spec.description == "test"
    assert spec.weights == RewardWeights()


@pytest.mark.parametrize("weight", [0.0, 0.5, 3])
def test_a_zero_or_positive_broken_tool_call_weight_is_refused(weight: float, tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as exc:
        RewardWeights(tool_broken=weight)
    assert "must be negative" in str(exc.value)
    text = V1_TOML.replace("tool_broken = -0.5", f"tool_broken = {weight}")
    with pytest.raises(SpecError, match=r"weights\.tool_broken: .*must be negative"):
        load_spec(write(tmp_path, text))


def test_content_hash_is_stable_and_changes_with_any_weight() -> None:
    base = RewardSpec(version="v1")
    assert base.content_hash == RewardSpec(version="v1").content_hash
    assert len(base.content_hash) == 16 and int(base.content_hash, 16) >= 0
    hashes = {base.content_hash}
    for name, value in RewardWeights().model_dump().items():
        changed = RewardSpec(version="v1", weights=RewardWeights(**{name: value - 0.125}))
        hashes.add(changed.content_hash)
    assert len(hashes) == 1 + len(RewardWeights.model_fields)
    assert RewardSpec(version="v1x").content_hash != base.content_hash


def test_content_hash_ignores_file_formatting(tmp_path: Path) -> None:
    a = load_spec(write(tmp_path, V1_TOML, "a.toml"))
    same = '# same content, other layout\ndescription = "test"\nversion = "v1"\n[weights]\ntool_broken = -0.50\n'
    b = load_spec(write(tmp_path, same, "b.toml"))
    assert a.content_hash == b.content_hash


@pytest.mark.parametrize(("text", "field"), [
    (V1_TOML.replace("persistence = 1.0", "persistance = 1.0"), "weights.persistance"),
    (V1_TOML.replace("persistence = 1.0", 'persistence = "high"'), "weights.persistence"),
    (V1_TOML.replace('version = "v1"', 'version = "v 1!"'), "version"),
    (V1_TOML.replace('version = "v1"\n', ""), "version"),
    ("extra_top_level = 1\n" + V1_TOML, "extra_top_level"),
])
def test_load_errors_name_the_file_and_the_field(text: str, field: str, tmp_path: Path) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as exc:
        load_spec(path)
    message = str(exc.value)
    assert message.startswith(f"{path}: {field}: "), message


def test_unreadable_files_are_spec_errors_naming_the_file(tmp_path: Path) -> None:
    broken = write(tmp_path, 'version = "v1"\n[weights\n')
    with pytest.raises(SpecError, match=str(broken)):
        load_spec(broken)
    missing = tmp_path / "missing.toml"
    with pytest.raises(SpecError, match=str(missing)):
        load_spec(missing)


def test_specs_are_frozen() -> None:
    spec = RewardSpec(version="v1")
    with pytest.raises(ValidationError):
        spec.weights.tool_broken = 1.0  # type: ignore[misc]
