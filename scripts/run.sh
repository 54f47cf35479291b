#!/usr/bin/env bash
# The main command (README): set up, build, then show the active backends, check them against the
# oracle and run the quick benchmark (table + plot in bench-out/). Extra arguments go to `bench`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/scripts/setup_env.sh" | tail -n 1)"
cd "$ROOT"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
mkdir -p bench-out
"$PY" -m paged_attention_ext info
"$PY" -m paged_attention_ext check
if [[ $# -eq 0 ]]; then set -- --quick; fi
exec "$PY" -m paged_attention_ext bench --json bench-out/bench.json --plot bench-out/bench.png "$@"
