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
# The extension was just built: a _C that does not load fails the import (and so the tests)
# instead of leaving the PyTorch implementation to pass them. PAGED_ATTN_DISABLE_EXTENSION=1 wins.
export PAGED_ATTN_REQUIRE_EXTENSION="${PAGED_ATTN_REQUIRE_EXTENSION:-1}"
"$PY" -c "import paged_attention_ext as pa; print('[test] extension _C:', pa.extension_status())" >&2
# No arguments: everything under tests/ (pyproject's testpaths) but @slow.
if [[ $# -eq 0 ]]; then set -- -m "not slow"; fi
exec "$PY" -m pytest -q -rs "$@"
