"""The console script mounts only the command it is given, and still dispatches it as a subcommand."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "from rewardflow.cli.main import main; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args", [("run", "--help"), ("kafka", "--help"), ("sql", "--help")])
def test_a_named_command_runs_as_a_subcommand(args: tuple[str, ...]) -> None:
    got = _cli(*args)
    assert got.returncode == 0, got.stderr
    usage = " ".join(got.stdout.split())
    assert usage.startswith("Usage: ") and f" {args[0]} [OPTIONS]" in usage.split(" [ARGS]")[0], usage[:80]


def test_a_named_command_does_not_import_the_others() -> None:
    code = ("import sys; sys.argv = ['rewardflow', 'sql']; import rewardflow.cli.main; "
            "print(sorted(m for m in sys.modules if m.startswith('rewardflow.cli.') and m != 'rewardflow.cli.main'))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.stdout.strip() == "['rewardflow.cli.sql']", got.stderr


def test_the_version_is_answered_without_importing_any_command_or_driver() -> None:
    code = ("import sys; sys.argv = ['rewardflow', '--version']; from rewardflow.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('rewardflow.cli.', 'clickhouse_connect', 'pyarrow', "
            "'pydantic_settings')) and m != 'rewardflow.cli.main'))")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert got.stdout.strip().splitlines()[-1] == "[]", (got.stdout, got.stderr)
    assert got.stdout.startswith("rewardflow "), got.stdout


def test_help_and_an_unknown_name_list_every_command() -> None:
    listed = _cli("--help").stdout
    for name in ("run", "kafka", "emit", "sql", "bench", "collect"):
        assert f"│ {name} " in listed, name
    unknown = _cli("nosuch")
    assert unknown.returncode == 2 and "No such command 'nosuch'" in unknown.stderr


def test_a_flag_is_shown_without_a_value_type() -> None:
    got = _cli("export", "--help")
    rows = {line.split()[1]: line for line in got.stdout.splitlines() if line.startswith("│") and "--" in line}
    assert "<bool>" not in rows["--overwrite"] and "<bool>" not in rows["--help"], got.stdout
    assert "<float>" in rows["--settle"]  # (an option that takes a value names its type)


def test_the_version_and_a_short_help_flag() -> None:
    from importlib.metadata import version

    got = _cli("--version")
    assert got.returncode == 0 and got.stdout.strip() == f"rewardflow {version('rewardflow')}", got.stderr
    short, long = _cli("-h"), _cli("--help")
    assert short.returncode == 0 and short.stdout == long.stdout
    assert _cli("sql", "-h").stdout == _cli("sql", "--help").stdout
