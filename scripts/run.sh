#!/usr/bin/env bash
# One entry point for a fresh machine: set up the venv (idempotent), then
#   bash scripts/run.sh demo    -> run the main job on local defaults (Kafka from Maven Central + chDB)
#   bash scripts/run.sh test    -> check generated code, build the TypeScript client (clients/typescript),
#                                 type-check (mypy --strict over src/ and streams/), then run the test suite
#                                 in parallel, one process per core up to 4 (each starts and stops its own
#                                 Kafka broker; a test file's tests run in one of them, in order), then the
#                                 fault tests (kills, outages) in two processes;
#                                 with arguments, one pytest run of just those (e.g. a path, `-n 2`)
#   bash scripts/run.sh bench   -> run the benchmarks
#   bash scripts/run.sh <any rewardflow subcommand ...>
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${REWARDFLOW_VENV:-$root/.venv}"
py="${PYTHON:-python3}"

need() { command -v "$1" >/dev/null 2>&1 || { echo "error: $1 is required ($2)" >&2; exit 2; }; }
need "$py" "Python >= 3.11"
"$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' \
  || { echo "error: Python >= 3.11 is required (found $("$py" --version 2>&1))" >&2; exit 2; }

stamp="$venv/.rewardflow-installed"
if [ ! -x "$venv/bin/python" ]; then
  echo "==> creating virtualenv $venv"
  "$py" -m venv "$venv"
fi
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "==> installing rewardflow and its dependencies (first run takes a few minutes)"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e ".[dev]"
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"

cmd="${1:-demo}"; shift || true
case "$cmd" in
  test)
    need java "Java 17+ runs the local Kafka broker"
    need mvn "Maven resolves Apache Kafka from Maven Central"
    echo "==> generated modules up to date (rewardflow codegen --check)"
    "$venv/bin/rewardflow" codegen --check
    need node "Node.js 18+ runs the TypeScript client's tests"
    need npm "npm installs the TypeScript client's build tools (typescript, @types/node)"
    echo "==> TypeScript client: npm ci, build (clients/typescript)"
    (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && npm run build)
    echo "==> mypy --strict (src/rewardflow, streams)"
    "$venv/bin/python" -m mypy
    pytest=("$venv/bin/python" -m pytest -q -p no:cacheprovider --durations=15)
    if [ "$#" -gt 0 ]; then
      exec "${pytest[@]}" "$@"
    fi
    echo "==> tests, in one process per core (up to 4), then the fault-injection tests in two processes"
    rc=0
    "${pytest[@]}" -n auto --maxprocesses 4 --dist loadfile -m "not fault" || rc=$?
    "${pytest[@]}" -n 2 --dist loadfile -m fault || rc=$((rc ? rc : $?))
    exit "$rc"
    ;;
  bench)
    exec "$venv/bin/rewardflow" bench "$@"
    ;;
  *)
    exec "$venv/bin/rewardflow" "$cmd" "$@"
    ;;
esac
