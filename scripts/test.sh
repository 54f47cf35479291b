#!/usr/bin/env bash
# The test command (README): set up, build, then run the test suite. Extra arguments go to pytest.
#   bash scripts/test.sh                 # everything but @slow
#   bash scripts/test.sh -m slow         # the slow ones
#   bash scripts/test.sh tests/test_fuzz.py   # one file
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/setup_env.sh" | tail -n 1)"
cd "$ROOT"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# No arguments: everything under tests/ (pyproject's testpaths) but @slow.
if [[ $# -eq 0 ]]; then set -- -m "not slow"; fi
exec "$PY" -m pytest -q -rs "$@"
