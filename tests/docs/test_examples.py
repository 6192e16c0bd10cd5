"""Every Python and shell code block of README.md and docs/*.md runs, one test per block.

A block is a fenced code block whose info string starts with ``python``/``py`` or
``bash``/``sh``/``shell``/``console``. A block whose info string also carries the word
``illustrative`` (```` ```bash illustrative ````) is not run: slow or recursive commands
(``bash scripts/run.sh test``), output-only transcripts, configuration for a production
system. Test ids name the block (``README.md:L60``).

Each block runs in a fresh process (Python: ``.venv/bin/python FILE``; shell:
``bash -euo pipefail FILE``) in a temporary working directory (the repository root when
it names repository paths such as ``scripts/`` or ``examples/``), with ``.venv/bin``
first on PATH and every ``REWARDFLOW_*`` variable of the caller replaced by per-test
ones: a private ``REWARDFLOW_HOME``, ``REWARDFLOW_CLICKHOUSE_DSN=chdb://<tmp>``, a unique
``REWARDFLOW_TOPIC_PREFIX`` (topics and consumer groups), a free ``REWARDFLOW_WEB_PORT``,
and a ``REWARDFLOW_KAFKA_BOOTSTRAP`` where nothing listens unless the block needs Kafka.

What a block needs is read from its text (see :func:`needs`), the way its prose says:

* ``kafka``: it sends events or runs the pipeline -> the session broker
  (``tests/conftest_kafka.py``);
* ``reads``: it reads the tables (``RewardReader``, ``rewardflow sql``/``export``, the
  read endpoint) -> it runs while ``rewardflow run`` runs on the same home and chDB
  (with ``--no-worker``: the sink, which creates the tables, and the read endpoint);
* ``broker``: it starts the local broker (``rewardflow kafka up``) -> a loopback
  bootstrap on a free port whose next port is free too (the controller's), the jar
  cache of the session shared read-only; afterwards the broker must answer there and
  its controller listen on the next port, and ``rewardflow kafka down`` stops it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from confluent_kafka import KafkaException

from rewardflow.kafka_local.admin import admin_client, delete_topics, metadata_ready
from rewardflow.kafka_local.errors import KafkaLocalError
from rewardflow.kafka_local.maven import ensure_kafka_jars, kafka_cache_dir
from rewardflow.settings import load_settings
from tests.conftest_kafka import SessionBroker

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
VENV_BIN = ROOT / ".venv" / "bin"
PYTHON = VENV_BIN / "python"
REWARDFLOW = str(VENV_BIN / "rewardflow")

PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
OTHER_LANGS = {"sql", "text", "toml", "json", "jsonl", "yaml", "ini", "diff", "typescript"}  # shown, never run
ILLUSTRATIVE = "illustrative"
TIMEOUT_S = {"python": 60.0, "shell": 120.0}

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")  # also fences nested in lists
_KAFKA = re.compile(r"EventProducer|\brewardflow (emit|run|simulate)\b")
_READS = re.compile(r"RewardReader|\brewardflow (sql|export|audit|alerts|compare|keys)\b|/query\b|/v1/(events|traces)\b")
_BROKER = re.compile(r"\brewardflow kafka up\b")
_REPO_PATHS = re.compile(r"(?<![\w/.$-])(scripts|schemas|examples|bench|docs|src|streams|tests)/")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a document."""

    doc: Path
    line: int  # of the opening fence, 1-based
    info: str
    code: str

    @property
    def lang(self) -> str:
        words = self.info.split()
        return words[0].lower() if words else ""

    @property
    def kind(self) -> str | None:
        return "python" if self.lang in PYTHON_LANGS else "shell" if self.lang in SHELL_LANGS else None

    @property
    def illustrative(self) -> bool:
        return ILLUSTRATIVE in self.info.split()[1:]

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:L{self.line}"


def blocks_of(doc: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (an unclosed one runs to the end of the file)."""
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, indent, start = m["fence"], len(m["indent"]), i
        body: list[str] = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) == {fence[0]}:
                break
            text = lines[i]
            body.append(text[min(indent, len(text) - len(text.lstrip(" "))):])
            i += 1
        found.append(Block(doc, start + 1, m["info"].strip(), "\n".join(body) + "\n"))
        i += 1
    return found


ALL_BLOCKS = [b for doc in DOCUMENTS for b in blocks_of(doc)]
RUNNABLE = [b for b in ALL_BLOCKS if b.kind is not None]


def needs(block: Block) -> set[str]:
    """What the block needs besides a home and a chDB directory: ``kafka``, ``reads``, ``broker``."""
    found = set()
    if _BROKER.search(block.code):
        found.add("broker")
    if _KAFKA.search(block.code):
        found.add("kafka")
    if _READS.search(block.code):
        found |= {"reads", "kafka"}  # `rewardflow run` needs a broker
    return found


def _param(block: Block) -> object:
    marks: list[pytest.MarkDecorator] = []
    wanted = needs(block)
    if wanted & {"kafka", "broker"}:
        marks.append(pytest.mark.kafka)
    if "reads" in wanted:
        marks.append(pytest.mark.clickhouse)
    if block.illustrative:
        marks.append(pytest.mark.skip(reason=f"{block.id}: marked {ILLUSTRATIVE}"))
    return pytest.param(block, id=block.id, marks=marks)


# --- the documents are what this file thinks they are ------------------------------------


def test_blocks_are_found() -> None:
    ids = {b.id.split(":")[0] for b in RUNNABLE if not b.illustrative}
    assert "README.md" in ids, "no runnable block found in README.md: is the fence parser broken?"


def test_every_block_has_a_known_language() -> None:
    """A misspelt info string (```` ```pyhton ````) would silently not run."""
    unknown = [f"{b.id}: {b.info!r}" for b in ALL_BLOCKS
               if b.lang and b.kind is None and b.lang not in OTHER_LANGS]
    assert not unknown, "code blocks with an unknown language (add it to OTHER_LANGS if it is never run):\n" + "\n".join(unknown)


def test_illustrative_is_only_a_marker_of_runnable_blocks() -> None:
    misplaced = [b.id for b in ALL_BLOCKS if ILLUSTRATIVE in b.info.split() and b.lang == ILLUSTRATIVE]
    assert not misplaced, f"`{ILLUSTRATIVE}` goes after the language (```bash {ILLUSTRATIVE}): {misplaced}"


# --- resources ------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_pair() -> int:
    """A loopback port ``p`` with ``p + 1`` free as well."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < 65535 and _port_free(port + 1) and _port_free(port):
            return port
    raise AssertionError("no two consecutive free loopback ports")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Workspace:
    """Where one block runs: directories and environment."""

    tmp: Path
    env: dict[str, str]

    @property
    def home(self) -> Path:
        return Path(self.env["REWARDFLOW_HOME"])


def make_workspace(tmp: Path, block: Block) -> Workspace:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    slug = re.sub(r"[^a-z0-9]+", "-", block.id.lower()).strip("-")
    env.update({
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "REWARDFLOW_HOME": str(tmp / "home"),
        "REWARDFLOW_CLICKHOUSE_DSN": f"chdb://{tmp / 'chdb'}",
        "REWARDFLOW_TOPIC_PREFIX": f"docs.{slug}.{uuid.uuid4().hex[:8]}.",
        "REWARDFLOW_WEB_PORT": str(free_port_pair()),  # the read endpoint, and the worker's metrics next to it
        "REWARDFLOW_COLLECT_PORT": str(free_port_pair()),  # the ingestion edge
        "REWARDFLOW_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port_pair()}",  # nothing listens (set per need below)
        "REWARDFLOW_PARTITIONS": "1",
        "PYTHONUNBUFFERED": "1",
    })
    (tmp / "home").mkdir()
    work = tmp / "work"
    work.mkdir()
    return Workspace(tmp, env)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def running_pipeline(ws: Workspace) -> Iterator[None]:
    """``rewardflow run --no-worker --collect`` (sink, read endpoint, ingestion edge) until the block is done."""
    log = ws.tmp / "rewardflow-run.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [REWARDFLOW, "run", "--no-worker", "--collect", "--status-interval", "0", "--monitor-interval", "0"],
            cwd=ws.tmp, env=ws.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{ws.env['REWARDFLOW_WEB_PORT']}/health"
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"rewardflow run exited with {proc.returncode}:\n{_tail(log.read_text())}", pytrace=False)
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=1) as answer:
                    if answer.status == 200:
                        break
            if time.monotonic() > deadline:
                pytest.fail(f"rewardflow run: no read endpoint at {url} after 60 s:\n{_tail(log.read_text())}", pytrace=False)
            time.sleep(0.1)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture(scope="session")
def jar_cache() -> Path:
    """The Kafka jar cache under the session's home, the session broker's (resolved once with Maven if missing)."""
    home = load_settings().home
    ensure_kafka_jars(home)
    return kafka_cache_dir(home) / "libs"


def _drop_topics(bootstrap: str, prefix: str) -> None:
    with contextlib.suppress(KafkaException, KafkaLocalError):  # cleanup only: the broker may be gone
        names = [t for t in admin_client(bootstrap).list_topics(timeout=10).topics if t.startswith(prefix)]
        delete_topics(bootstrap, names, timeout=10)


# --- the blocks -----------------------------------------------------------------------------


@pytest.mark.parametrize("block", [_param(b) for b in RUNNABLE])
def test_block_runs(block: Block, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    wanted = needs(block)
    ws = make_workspace(tmp_path, block)
    broker: SessionBroker | None = None
    if "kafka" in wanted:
        broker = request.getfixturevalue("kafka_broker")
        ws.env["REWARDFLOW_KAFKA_BOOTSTRAP"] = broker.bootstrap
    local_port: int | None = None
    if "broker" in wanted:
        assert "kafka" not in wanted, f"{block.id}: starts a broker and uses the session's: split the block"
        libs = request.getfixturevalue("jar_cache")
        local_port = free_port_pair()
        ws.env["REWARDFLOW_KAFKA_BOOTSTRAP"] = f"127.0.0.1:{local_port}"
        shared = kafka_cache_dir(ws.home) / "libs"
        shared.parent.mkdir(parents=True)
        shared.symlink_to(libs, target_is_directory=True)

    suffix = ".py" if block.kind == "python" else ".sh"
    script = ws.tmp / (re.sub(r"[^A-Za-z0-9.]+", "-", block.id) + suffix)
    script.write_text(block.code)
    command = [str(PYTHON), str(script)] if block.kind == "python" else ["bash", "-euo", "pipefail", str(script)]
    cwd = ROOT if block.kind == "shell" and _REPO_PATHS.search(block.code) else ws.tmp / "work"
    timeout = TIMEOUT_S[block.kind or "shell"]

    with contextlib.ExitStack() as stack:
        if broker is not None:
            stack.callback(_drop_topics, broker.bootstrap, ws.env["REWARDFLOW_TOPIC_PREFIX"])
        if local_port is not None:
            stack.callback(subprocess.run, [REWARDFLOW, "kafka", "down"], env=ws.env, cwd=ws.tmp,
                           capture_output=True, timeout=60, check=False)
        if "reads" in wanted:
            stack.enter_context(running_pipeline(ws))
        started = time.monotonic()
        try:
            proc = subprocess.run(command, cwd=cwd, env=ws.env, capture_output=True, text=True, timeout=timeout,
                                  check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.id}: still running after {timeout:.0f} s (mark it {ILLUSTRATIVE} if it must be slow)\n"
                        f"--- block ---\n{block.code}", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(
                f"{block.id} ({block.lang}) exited with {proc.returncode} after {time.monotonic() - started:.1f} s\n"
                f"--- block ---\n{block.code}--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}",
                pytrace=False)
        if local_port is not None:  # what the README says about the local broker's ports
            bootstrap = ws.env["REWARDFLOW_KAFKA_BOOTSTRAP"]
            assert metadata_ready(bootstrap, timeout=10), f"{block.id}: no broker answers at {bootstrap}\n{proc.stdout}"
            assert _listening(local_port + 1), f"{block.id}: the controller does not listen on {local_port + 1}"
