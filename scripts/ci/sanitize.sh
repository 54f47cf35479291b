#!/usr/bin/env bash
# Build the C++ code with AddressSanitizer + UndefinedBehaviorSanitizer (CPU-only, separate build
# folder: the normal build is untouched) and run the CPU-kernel tests on it. Any finding aborts
# the run with a report and a non-zero exit. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$(bash "$ROOT/scripts/setup_env.sh" | tail -n 1)"
cd "$ROOT"
STAGE="$ROOT/build/sanitize-pkg"   # a copy of the package with the instrumented _C
rm -rf "$STAGE" && mkdir -p "$STAGE"
cp -r paged_attention_ext "$STAGE/"
rm -rf "$STAGE"/paged_attention_ext/_C*.so
mkdir -p build
t0=$SECONDS
PAGED_ATTN_SANITIZE=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PY" setup.py -q build_ext --build-lib "$STAGE" \
  > build/sanitize-build.log 2>&1 \
  || { tail -n 40 build/sanitize-build.log >&2; echo "sanitize: the build FAILED (build/sanitize-build.log)" >&2; exit 1; }
echo "sanitize: built with ASan + UBSan in $((SECONDS - t0)) s" >&2
ls "$STAGE"/paged_attention_ext/_C*.so >/dev/null

# Python itself is not instrumented: preload the ASan runtime. Leak checking is off (CPython and
# torch keep allocations alive at exit by design); every other finding is fatal.
export LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export OMP_WAIT_POLICY=PASSIVE
if [[ $# -eq 0 ]]; then
  set -- "$ROOT/tests/test_conformance.py" "$ROOT/tests/test_cpu_kernel.py" "$ROOT/tests/test_robustness.py" "$ROOT/tests/test_bad_input.py" \
         "$ROOT/tests/test_fuzz.py" -m "not slow"
fi
# Run from the staging folder so `import paged_attention_ext` finds the instrumented copy first.
cd "$STAGE"
"$PY" -c "import paged_attention_ext as pa, sys; assert pa.extension_loaded(), pa.EXTENSION_IMPORT_ERROR; print('sanitized extension:', pa._C.__file__, file=sys.stderr)"
workers="$(nproc)"; ((workers > 8)) && workers=8
xdist=()
if ((workers > 1)) && "$PY" -c "import xdist" 2>/dev/null; then xdist=(-n "$workers"); fi
exec "$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" "${xdist[@]}" "$@"
