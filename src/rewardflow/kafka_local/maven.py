"""Resolve the Apache Kafka broker jars from Maven Central, once, into a cache.

Layout under ``home`` (``settings.home``, default ``~/.rewardflow``)::

    kafka/4.4.0/libs/*.jar              the broker's runtime classpath
    kafka/4.4.0/libs/.complete.json     marker: written last, lists every jar
    kafka/4.4.0/.resolve.lock           serialises concurrent resolutions

Contract of :func:`ensure_kafka_jars`: it returns a ``libs`` directory that is
complete, or raises. A complete cache is recognised by its marker and returned
without running Maven or touching the network. Maven resolves into a private
temporary directory that is renamed into place only after the marker is
written, so an interrupted resolution never leaves a half cache behind.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rewardflow.kafka_local.errors import ResolutionError
from rewardflow.kafka_local.locking import exclusive_lock
from rewardflow.kafka_local.tools import find_maven

KAFKA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"
# Kafka 4.4.0 itself depends on slf4j-api 1.7.36 and log4j-core 2.25.5 (runtime);
# log4j-slf4j-impl is the matching SLF4J 1.x -> log4j2 binding it leaves out.
LOG4J_VERSION = "2.25.5"
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
MAVEN_TIMEOUT_S = 1800.0
MARKER = ".complete.json"

Progress = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def kafka_cache_dir(home: Path) -> Path:
    """Directory holding this Kafka version's cache: ``home/kafka/<version>``."""
    return home.expanduser() / "kafka" / KAFKA_VERSION


def render_pom() -> str:
    """The throwaway pom whose runtime dependencies are the broker's classpath."""
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ]
    dep_xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rewardflow.local</groupId>
  <artifactId>kafka-broker-runtime</artifactId>
  <version>{KAFKA_VERSION}</version>
  <packaging>pom</packaging>
  <dependencies>
{dep_xml}
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN_VERSION}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def cached_jars(libs: Path) -> list[Path] | None:
    """The jars of a complete cache at ``libs``, or None if it is absent or incomplete."""
    try:
        marker = json.loads((libs / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("kafka") != KAFKA_VERSION or not marker.get("jars"):
        return None
    jars = [libs / name for name in marker["jars"]]
    return jars if all(jar.is_file() for jar in jars) else None


def _run_maven(work: Path, out: Path) -> None:
    (work / "pom.xml").write_text(render_pom())
    cmd = [
        str(find_maven()), "-q", "-B", "-f", str(work / "pom.xml"),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={out}",
    ]
    try:
        proc = subprocess.run(
            cmd, cwd=work, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise ResolutionError(f"Maven did not finish within {MAVEN_TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln]
        detail = lines[0] if lines else f"exit code {proc.returncode}"
        raise ResolutionError(f"Maven could not resolve Kafka {KAFKA_VERSION}: {detail}")


def ensure_kafka_jars(home: Path, progress: Progress | None = None) -> Path:
    """Return ``home/kafka/<version>/libs``, resolving it with Maven first if needed.

    Blocks for the whole resolution (minutes on a cold ``~/.m2``; milliseconds
    once cached). Concurrent callers wait on a file lock and reuse the winner's
    cache. Raises :class:`ToolMissingError` when ``mvn`` is needed but absent,
    :class:`ResolutionError` when Maven fails. ``progress`` (default: stderr)
    receives one line before and one after a resolution; a cache hit is silent.
    """
    report = progress or _stderr
    cache = kafka_cache_dir(home)
    libs = cache / "libs"
    if cached_jars(libs) is not None:
        return libs
    with exclusive_lock(cache / ".resolve.lock"):
        if cached_jars(libs) is not None:
            return libs
        find_maven()
        for leftover in cache.glob(".resolve-*"):  # from a killed resolution; we hold the lock
            shutil.rmtree(leftover, ignore_errors=True)
        report(f"resolving Apache Kafka {KAFKA_VERSION} from Maven Central into {libs} ...")
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=".resolve-", dir=cache) as tmp:
            work = Path(tmp)
            staged = work / "libs"
            _run_maven(work, staged)
            jars = sorted(p.name for p in staged.glob("*.jar"))
            if not any(name.startswith(f"kafka_{SCALA_VERSION}-") for name in jars):
                raise ResolutionError(f"Maven finished but no kafka_{SCALA_VERSION} jar in {staged}")
            marker = {"kafka": KAFKA_VERSION, "log4j": LOG4J_VERSION, "jars": jars}
            (staged / MARKER).write_text(json.dumps(marker, indent=1))
            if libs.exists():  # an incomplete cache from an older layout: replace it
                shutil.rmtree(libs)
            staged.rename(libs)
        report(f"resolved {len(jars)} jars in {time.monotonic() - started:.0f} s")
    return libs
