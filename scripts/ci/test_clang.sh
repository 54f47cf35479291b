#!/usr/bin/env bash
# test_clang.sh — the C++ code built with clang instead of GCC (the compiler family of macOS and of
# many conda / distro toolchains): a copy of the tree (build/clang) built CPU-only with
# CXX=clang++ against the torch of the main environment (set up by scripts/test.sh), checked to be
# clang's build with OpenMP exactly when clang can link an OpenMP program here (Debian's clang
# cannot without libomp-dev: then the build must go on without it and say so), then the CPU
# kernel tests on it. The main build is untouched. Extra arguments go to pytest.
#
# Env: PYTHON                      interpreter with torch; default .venv/bin/python
#      PAGED_ATTN_CLANG_INSTALL=1  as root: apt-get install clang if clang++ is missing
# Exit: 0 built and passed; 1 a build, check or test failed; 3 no clang++ (said plainly).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
COPY="$ROOT/build/clang"

if ! command -v clang++ >/dev/null && [[ "${PAGED_ATTN_CLANG_INSTALL:-0}" == 1 ]]; then
  (apt-get update -qq && apt-get install -y -qq --no-install-recommends clang) >/dev/null 2>&1 || true
fi
if ! command -v clang++ >/dev/null; then
  echo "test_clang: NO clang++ on this machine: the clang build is NOT tested in this run"
  exit 3
fi

bash "$ROOT/scripts/ci/copy_tree.sh" "$COPY"
cd "$COPY"
t0=$SECONDS
env -u PAGED_ATTN_BUILD_LOG -u PAGED_ATTN_PTXAS_VERBOSE CXX=clang++ CC=clang \
  PAGED_ATTN_BUILD_CUDA=0 MAX_JOBS="${MAX_JOBS:-2}" \
  "$PYTHON" setup.py build_ext --inplace >build-clang.log 2>&1 \
  || { tail -30 build-clang.log; echo "test_clang: the clang build FAILED (log: $COPY/build-clang.log)"; exit 1; }
echo "test_clang: built with $(clang++ --version | head -1) in $((SECONDS - t0)) s"

# What this run claims: clang's library, OpenMP exactly as the probe finds it, and the warning
# on import exactly when it has none.
"$PYTHON" - <<'EOF'
import sys
import warnings

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import paged_attention_ext as pa
sys.path.insert(0, "build_helpers")
from openmp_flags import openmp_flags

assert pa.extension_loaded(), pa.extension_status()
build = pa.build_info()
assert build["compiler"].startswith("clang "), build["compiler"]
assert build["openmp"] == (openmp_flags("clang++") is not None), build["openmp"]
warned = any("built without OpenMP" in str(w.message) for w in caught)
assert warned == (not build["openmp"]), [str(w.message) for w in caught]
print(f"test_clang: _C built by {build['compiler']}, "
      f"{'with OpenMP' if build['openmp'] else 'WITHOUT OpenMP (clang has no runtime here; warned)'}, "
      f"CPU kernel {pa.cpu_kernel()}")
EOF

if [[ $# -eq 0 ]]; then
  set -- tests/test_conformance.py tests/test_cpu_kernel.py tests/test_cpu_kernel_choice.py tests/test_cpu_isa_isolation.py \
         tests/test_build_info.py tests/test_bad_input.py tests/test_decode_layouts.py -m "not slow"
fi
PAGED_ATTN_REQUIRE_EXTENSION=1 "$PYTHON" -m pytest -q -p no:cacheprovider "$@"
