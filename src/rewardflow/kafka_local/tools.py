"""Locate the external programs the local broker needs: Java 17+ and Maven.

Both functions return an absolute path or raise :class:`ToolMissingError`
with a one-line message saying what to install. Neither touches the network.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from rewardflow.kafka_local.errors import ToolMissingError

MIN_JAVA = 17

_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major_version(version_output: str) -> int | None:
    """Major version from ``java -version`` output (``"1.8.0"`` -> 8, ``"17.0.15"`` -> 17)."""
    match = _VERSION.search(version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        return int(match.group(2))
    return major


def find_java(min_version: int = MIN_JAVA) -> Path:
    """Return the ``java`` executable from ``$JAVA_HOME`` or ``PATH``.

    Runs ``java -version`` once (about 0.1 s). Raises :class:`ToolMissingError`
    when no java is found or its major version is below ``min_version``.
    """
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home) / "bin" / "java" if java_home else None
    if candidate is None or not candidate.is_file():
        found = shutil.which("java")
        candidate = Path(found) if found else None
    if candidate is None:
        raise ToolMissingError(
            f"Java {min_version}+ is required to run Kafka but `java` is not on PATH "
            "(install e.g. openjdk-17-jre-headless, or set JAVA_HOME)"
        )
    try:
        proc = subprocess.run(
            [str(candidate), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolMissingError(f"cannot run {candidate} -version: {exc}") from None
    major = java_major_version(proc.stderr + proc.stdout)
    if major is None or major < min_version:
        found_text = f"Java {major}" if major is not None else "an unknown Java version"
        raise ToolMissingError(
            f"Kafka 4.x needs Java {min_version}+, but {candidate} is {found_text} "
            "(install openjdk-17 or newer, or set JAVA_HOME)"
        )
    return candidate


def find_maven() -> Path:
    """Return the ``mvn`` executable on ``PATH``; raises :class:`ToolMissingError` if absent."""
    found = shutil.which("mvn")
    if found is None:
        raise ToolMissingError(
            "Maven (`mvn`) is required once to download the Kafka jars from Maven Central "
            "but is not on PATH (install e.g. the `maven` package)"
        )
    return Path(found)
