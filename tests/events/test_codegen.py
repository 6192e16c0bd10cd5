"""The event models are generated from the schemas, and a stale or impossible schema is refused. Pure."""

from __future__ import annotations

import copy
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from rewardflow.cli.main import app
from rewardflow.events import codegen, models
from rewardflow.events.catalogue import ModelsStale, load_catalogue, schema_dir

SOURCES = codegen.load_sources(schema_dir())


def _field(sources: dict[str, dict[str, Any]], record: str, name: str) -> dict[str, Any]:
    return next(f for f in sources[record]["fields"] if f["name"] == name)


def _namespace(text: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run the generator's output as a module (pydantic resolves the annotations through sys.modules)."""
    module = types.ModuleType("generated_models")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(text, "<generated>", "exec"), module.__dict__)  # noqa: S102 - the generator's own output
    return module.__dict__


def test_the_committed_models_are_the_generators_output() -> None:
    assert (Path(models.__file__).read_text()) == codegen.render(SOURCES)
    assert models.SCHEMA_DIGEST == codegen.schema_digest(SOURCES)


def test_a_constraint_in_a_schema_becomes_a_validation_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    sources = copy.deepcopy(SOURCES)
    _field(sources, "AgentEdit", "language")["constraints"] = {"minLength": 1, "maxLength": 3}
    edit = _namespace(codegen.render(sources), monkeypatch)["AgentEdit"]
    good = dict(event_id="e", ts=1_700_000_000_000, org_id="o", session_id="s", request_id="r",
                producer={"name": "p", "version": "1"}, edit_id="x", file_path_hash="h", language="py",
                lines_added=1, lines_removed=0, chars_inserted=3)
    assert edit(**good).language == "py"
    with pytest.raises(ValidationError) as info:
        edit(**{**good, "language": "python"})
    assert info.value.errors()[0]["loc"] == ("language",)


def test_minimum_field_renders_a_cross_field_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    served = _namespace(codegen.render(SOURCES), monkeypatch)["InferenceServed"]
    base = dict(event_id="e", ts=1_700_000_000_000, org_id="o", session_id="s", request_id="r",
                producer={"name": "p", "version": "1"}, surface="agent", checkpoint_id="c", experiment_arm="a",
                ttft_ms=50, prompt_tokens=1, completion_tokens=1)
    assert served(**base, latency_ms=50).latency_ms == 50
    with pytest.raises(ValidationError, match=r"latency_ms \(49\) must be >= ttft_ms \(50\)"):
        served(**base, latency_ms=49)


@pytest.mark.parametrize(
    ("record", "field", "constraints", "message"),
    [
        ("AgentEdit", "language", {"maxLen": 3}, "unknown constraint"),
        ("AgentEdit", "lines_added", {"maxLength": 3}, "constraint does not apply to int"),
        ("ToolCall", "status", {"minLength": 1}, "an enum takes no constraints"),
    ],
)
def test_a_constraint_the_generator_cannot_honour_names_the_field(
    record: str, field: str, constraints: dict[str, Any], message: str
) -> None:
    sources = copy.deepcopy(SOURCES)
    _field(sources, record, field)["constraints"] = constraints
    with pytest.raises(ValueError, match=f"{record}.{field}: {message}"):
        codegen.render(sources)


def test_envelope_fields_must_be_identical_in_every_event() -> None:
    sources = copy.deepcopy(SOURCES)
    _field(sources, "FollowUp", "org_id")["constraints"] = {"minLength": 1, "maxLength": 64}
    with pytest.raises(ValueError, match="FollowUp: the envelope fields"):
        codegen.render(sources)


def test_loading_schemas_the_models_were_not_generated_from_is_refused(tmp_path: Path) -> None:
    shutil.copytree(schema_dir(), tmp_path / "schemas")
    assert load_catalogue(tmp_path / "schemas").current["AgentEdit"].name == "AgentEdit"
    path = tmp_path / "schemas" / "rewardflow.events.AgentEdit.avsc"
    path.write_text(path.read_text().replace('"maxLength": 64', '"maxLength": 65', 1))
    with pytest.raises(ModelsStale, match="run `rewardflow codegen`"):
        load_catalogue(tmp_path / "schemas")


def test_codegen_check_reports_a_stale_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    ok = runner.invoke(app, ["codegen", "--check"])
    assert ok.exit_code == 0 and "up to date" in ok.output
    shutil.copytree(schema_dir(), tmp_path / "schemas")
    path = tmp_path / "schemas" / "rewardflow.events.Producer.avsc"
    path.write_text(path.read_text().replace("Client version string.", "The client's version string."))
    monkeypatch.setenv("REWARDFLOW_SCHEMA_DIR", str(tmp_path / "schemas"))
    stale = runner.invoke(app, ["codegen", "--check"])
    assert stale.exit_code == 1 and "stale: src/rewardflow/events/models.py" in stale.output
