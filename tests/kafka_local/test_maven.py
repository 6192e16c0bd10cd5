from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from rewardflow.kafka_local import maven
from rewardflow.kafka_local.errors import ResolutionError, ToolMissingError

NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def test_pom_declares_kafka_and_a_log4j2_binding() -> None:
    root = ET.fromstring(maven.render_pom())
    deps = {
        (d.findtext("m:groupId", namespaces=NS), d.findtext("m:artifactId", namespaces=NS)):
            d.findtext("m:version", namespaces=NS)
        for d in root.iterfind("m:dependencies/m:dependency", NS)
    }
    assert deps[("org.apache.kafka", "kafka_2.13")] == maven.KAFKA_VERSION
    assert ("org.apache.logging.log4j", "log4j-core") in deps
    assert ("org.apache.logging.log4j", "log4j-slf4j-impl") in deps


def write_cache(home: Path, jars: list[str], version: str = maven.KAFKA_VERSION) -> Path:
    libs = maven.kafka_cache_dir(home) / "libs"
    libs.mkdir(parents=True)
    for jar in jars:
        (libs / jar).write_bytes(b"")
    (libs / maven.MARKER).write_text(json.dumps({"kafka": version, "jars": jars}))
    return libs


def test_complete_cache_is_used_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    libs = write_cache(tmp_path, ["kafka_2.13-4.4.0.jar", "a.jar"])

    def no_maven() -> Path:
        raise ToolMissingError("mvn must not be needed")

    monkeypatch.setattr(maven, "find_maven", no_maven)
    assert maven.ensure_kafka_jars(tmp_path, progress=pytest.fail) == libs


@pytest.mark.parametrize("damage", ["missing_jar", "no_marker", "other_version"])
def test_incomplete_cache_is_not_trusted(tmp_path: Path, damage: str) -> None:
    libs = write_cache(tmp_path, ["a.jar"], version="3.9.0" if damage == "other_version" else maven.KAFKA_VERSION)
    if damage == "missing_jar":
        (libs / "a.jar").unlink()
    if damage == "no_marker":
        (libs / maven.MARKER).unlink()
    assert maven.cached_jars(libs) is None


def test_maven_failure_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "mvn"
    fake.write_text("#!/bin/sh\necho '[ERROR] Could not resolve dependencies' ; exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(maven, "find_maven", lambda: fake)
    with pytest.raises(ResolutionError, match="Could not resolve"):
        maven.ensure_kafka_jars(tmp_path / "home", progress=lambda line: None)
    cache = maven.kafka_cache_dir(tmp_path / "home")
    assert not (cache / "libs").exists()
    assert not list(cache.glob(".resolve-*"))
