#!/usr/bin/env bash
# The test command (README): set up, build, then run the tests on every core (pytest-xdist).
#   bash scripts/test.sh                 # the core: every backend this machine runs against the
#                                        # oracle, the registry, bad input, opcheck, the integrations
#   bash scripts/test.sh --all           # everything: also the @slow tests (long rows, a trained
#                                        # model, the CUDA host simulation, CMake, cross builds)
#   bash scripts/test.sh -m slow         # only the @slow ones
#   bash scripts/test.sh tests/test_fuzz.py   # one file; other arguments go to pytest too
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/setup_env.sh" | tail -n 1)"
cd "$ROOT"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# The extension was just built: a _C that does not load fails the import (and so the tests)
# instead of leaving the PyTorch implementation to pass them. PAGED_ATTN_DISABLE_EXTENSION=1 wins.
export PAGED_ATTN_REQUIRE_EXTENSION="${PAGED_ATTN_REQUIRE_EXTENSION:-1}"
"$PY" -c "import paged_attention_ext as pa; print('[test] extension _C:', pa.extension_status())" >&2

ALL=0
args=()
for arg in "$@"; do
  if [[ $arg == --all ]]; then ALL=1; else args+=("$arg"); fi
done
# No selection of our own: the core (everything under tests/, pyproject's testpaths, but @slow).
if [[ $ALL == 0 && ${#args[@]} -eq 0 ]]; then args=(-m "not slow"); fi
# One worker per core, at most 8 (pytest-xdist; -n / -p no:xdist given by the caller win), a test
# file to one worker (its fixtures, e.g. the host simulation's driver builds, are made once).
if [[ " ${args[*]:-} " != *" -n "* && " ${args[*]:-} " != *"no:xdist"* ]] \
    && "$PY" -c "import xdist" 2>/dev/null; then
  workers="$(nproc)"; ((workers > 8)) && workers=8
  ((workers > 1)) && args=(-n "$workers" --dist loadfile "${args[@]}")
fi
exec "$PY" -m pytest -q -rs "${args[@]}"
