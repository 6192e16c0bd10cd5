"""The Dockerfile, .dockerignore and docker-compose.yml read as text (no Docker needed): the
properties the image relies on. Pure, except that the healthcheck's probe is run against a
stand-in /metrics server on loopback."""

from __future__ import annotations

import http.server
import json
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        keyword, _, args = (buf + s).partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends in a continuation line"
    return out


def _final_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    last_from = max(i for i, (k, _) in enumerate(ins) if k == "FROM")
    return ins[last_from:]


def _copy_sources(args: str) -> list[str]:
    """The build-context sources of one COPY (none for COPY --from=stage)."""
    words = args.split()
    if any(w.startswith("--from=") for w in words):
        return []
    paths = [w for w in words if not w.startswith("--")]
    return paths[:-1]


def test_the_base_is_python_3_11_slim() -> None:
    stages: list[str] = []
    for keyword, args in _instructions():
        if keyword == "FROM":
            image, *alias = args.split()
            assert image == "python:3.11-slim" or image in stages, f"FROM {args}"
            stages.append(alias[-1] if alias else image)


def test_the_entrypoint_runs_as_a_non_root_user() -> None:
    stage = _final_stage()
    keywords = [k for k, _ in stage]
    entry = keywords.index("ENTRYPOINT")
    users = [a for k, a in stage[:entry] if k == "USER"]
    assert users, "no USER before ENTRYPOINT: the process would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert json.loads(dict(stage)["ENTRYPOINT"]) == ["rewardflow"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "rewardflow" in scripts
    assert json.loads(dict(stage)["CMD"]) == ["run"]


def test_dependencies_are_installed_before_any_source_is_copied() -> None:
    """A source change must not invalidate the dependency layer."""
    ins = _instructions()
    deps = next(i for i, (k, a) in enumerate(ins) if k == "RUN" and "pip install -r" in a)
    first_source = next(i for i, (k, a) in enumerate(ins)
                        if k == "COPY" and any(p.rstrip("/") in ("src", "streams") for p in _copy_sources(a)))
    assert deps < first_source
    # what the dependency layer sees from the context: pyproject.toml and nothing else
    context_copies = {p for k, a in ins[:deps] if k == "COPY" for p in _copy_sources(a)}
    assert context_copies == {"pyproject.toml"}
    # and the final stage is built on that layer
    deps_stage = next(a.split()[-1] for k, a in reversed(ins[:deps]) if k == "FROM")
    assert _final_stage()[0][1].split()[0] == deps_stage


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            neg = s.startswith("!")
            pat = s.lstrip("!").strip("/")
            rx = re.escape(pat).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
            rules.append((neg, re.compile(rx + "$")))

    def ignored(path: str) -> bool:
        # Docker: the last rule matching the path or one of its parent directories decides
        parts = path.strip("/").split("/")
        result = False
        for neg, rx in rules:
            if any(rx.match("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
                result = not neg
        return result

    sources = [p for k, a in _instructions() if k == "COPY" for p in _copy_sources(a)]
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: not in the repository"
        assert not ignored(src), f"COPY {src}: excluded by .dockerignore"
    for kept_out in (".git", ".venv", "tests", "bench/results", "src/rewardflow/__pycache__"):
        assert ignored(kept_out), f"{kept_out} is in the build context"


def test_the_schemas_are_where_rewardflow_schema_dir_points() -> None:
    stage = _final_stage()
    dest = next(a.split()[-1] for k, a in stage if k == "COPY" and _copy_sources(a) == ["schemas/"])
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(a for k, a in stage if k == "ENV")))
    assert env["REWARDFLOW_SCHEMA_DIR"].rstrip("/") == dest.rstrip("/")
    assert env["REWARDFLOW_HOME"] == dict(stage)["WORKDIR"]  # the Faust worker's data directory is its cwd


@pytest.fixture
def metrics_port() -> Iterator[int]:
    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_healthcheck_probes_the_worker_metrics(metrics_port: int) -> None:
    """The probe asks REWARDFLOW_WEB_PORT + 1 for /metrics (as the worker serves it) with urllib."""
    stage = _final_stage()
    check = next(a for k, a in stage if k == "HEALTHCHECK")
    argv = json.loads(check[check.index("CMD") + 3:].strip())
    assert argv[:2] == ["python", "-c"]

    def probe(**env: str) -> int:
        return subprocess.run([sys.executable, "-c", argv[2]], env=env, capture_output=True, timeout=30).returncode

    assert probe(REWARDFLOW_WEB_PORT=str(metrics_port - 1)) == 0
    assert probe(REWARDFLOW_WEB_PORT=str(metrics_port - 1), REWARDFLOW_WEB_HOST="0.0.0.0") == 0
    assert probe(REWARDFLOW_WEB_PORT=str(metrics_port)) != 0  # nothing answers there


def test_compose_runs_the_image_with_rewardflow_subcommands() -> None:
    from rewardflow.cli.main import _COMMANDS, _GROUPS

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    ours = {name: svc for name, svc in compose["services"].items() if svc.get("image") == "rewardflow:local"}
    assert set(ours) == {"worker", "collector", "simulate"}
    for name, svc in ours.items():
        assert svc["build"] == "."
        assert svc["command"][0] in set(_COMMANDS) | set(_GROUPS), f"{name}: {svc['command']}"
