from __future__ import annotations

from pathlib import Path

import pytest

from rewardflow.kafka_local import tools
from rewardflow.kafka_local.errors import ToolMissingError


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_402"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ("garbage", None),
    ],
)
def test_java_major_version(output: str, major: int | None) -> None:
    assert tools.java_major_version(output) == major


def test_missing_java_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ToolMissingError, match="Java 17") as info:
        tools.find_java()
    assert "\n" not in str(info.value)


def test_old_java_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho \'java version "1.8.0_402"\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ToolMissingError, match="is Java 8"):
        tools.find_java()


def test_missing_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ToolMissingError, match="Maven"):
        tools.find_maven()
