"""Every schema in the working copy can read data written with each of its committed versions.

For ``schemas/<file>.avsc`` the versions are the commits of ``git log -- <file>``;
each old version is resolved together with the other schema files of the same
commit (named types such as Producer live in their own files). Versions kept
in ``schemas/history/<Name>.v<N>.avsc`` are checked the same way. The check is
:func:`rewardflow.events.compat.check_backward` (new schema = reader).
"""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import load_schema

from rewardflow.events.catalogue import default_catalogue, schema_dir
from rewardflow.events.compat import check_backward
from rewardflow.events.samples import session_events

SCHEMAS = schema_dir()


def _run_git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout


def _repo() -> Path | None:
    if shutil.which("git") is None:
        return None
    try:
        return Path(_run_git(SCHEMAS, "rev-parse", "--show-toplevel").strip())
    except subprocess.CalledProcessError:
        return None


REPO = _repo()


def _git(*args: str) -> str:
    """Run git at the top of the checkout (paths in and out are repository-relative)."""
    assert REPO is not None
    return _run_git(REPO, *args)
needs_git = pytest.mark.skipif(REPO is None, reason=f"{SCHEMAS} is not inside a git checkout (or git is missing): no committed versions to compare with")


def _rel(path: Path) -> str:
    assert REPO is not None
    return path.resolve().relative_to(REPO.resolve()).as_posix()


def _schemas_at(sha: str, tmp: Path) -> Path:
    """Write ``schemas/*.avsc`` as of ``sha`` into a fresh directory."""
    rel = _rel(SCHEMAS)
    out = tmp / sha
    out.mkdir()
    for name in _git("ls-tree", "--name-only", f"{sha}:{rel}").split():
        if name.endswith(".avsc"):
            (out / name).write_text(_git("show", f"{sha}:{rel}/{name}"))
    return out


def _versions(path: Path) -> list[str]:
    return [sha for sha in _git("log", "--format=%H", "--", _rel(path)).split()
            if path.name in _git("ls-tree", "--name-only", f"{sha}:{_rel(SCHEMAS)}").split()]


@needs_git
@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.avsc")), ids=lambda p: p.stem.rsplit(".", 1)[-1])
def test_working_copy_reads_every_committed_version(path: Path, tmp_path: Path) -> None:
    shas = _versions(path)
    if not shas:
        pytest.skip(f"{path.name} has no committed version yet")
    reader = load_schema(str(path))
    for sha in shas:
        writer = load_schema(str(_schemas_at(sha, tmp_path) / path.name))
        assert check_backward(reader, writer) == [], f"{path.name} is not backward compatible with {sha[:10]}"


HISTORY = sorted((SCHEMAS / "history").glob("*.avsc"))


@pytest.mark.skipif(not HISTORY, reason="schemas/history/ holds no retired versions yet")
@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_working_copy_reads_retired_versions(path: Path) -> None:
    name = path.name.split(".")[0]
    reader = load_schema(str(default_catalogue().writer(name).path))
    assert check_backward(reader, load_schema(str(path))) == []


def test_fastavro_agrees_current_batch_reads_itself() -> None:
    """Sanity of the harness: data written with the batch schema resolves against a reloaded copy."""
    parsed = default_catalogue().writer("EventBatch").parsed
    events = [e.model_dump() for e in session_events(3)]
    record: dict[str, Any] = {"batch_id": "b", "session_id": events[0]["session_id"],
                              "events": [(f"rewardflow.events.{e['event_type']}", e) for e in events]}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    buf.seek(0)
    reloaded = fastavro.parse_schema(load_schema(str(SCHEMAS / "rewardflow.events.EventBatch.avsc")))
    back = fastavro.schemaless_reader(buf, parsed, reloaded)
    assert [e["event_id"] for e in back["events"]] == [e["event_id"] for e in events]
