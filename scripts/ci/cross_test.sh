#!/usr/bin/env bash
# cross_test.sh — proves the CPU kernel variants on the hardware / emulator they target, without
# torch: builds tests/cross/driver.cpp with the framework-free kernel sources (csrc/cpu) for the
# host (g++: every x86 variant this CPU runs) and for aarch64 (aarch64-linux-gnu-g++ -static, run
# under qemu-aarch64: neon and scalar), and runs each on a folder of cases written by
# tests/support/cross_cases.py (tests/test_cpu_kernel_cross.py runs this script from pytest).
#
# Usage: bash scripts/ci/cross_test.sh [--host | --arm | --arm-clang] [CASE_DIR]
#   CASE_DIR  cases to run; default: written to $BUILD/cases first (needs torch + the package)
#   --host / --arm   only that build (default: both)
#   --arm-clang      only the aarch64 build by clang++ --target=aarch64-linux-gnu (the compiler
#                    family of Apple silicon; links against the GCC cross toolchain's libraries)
# Env: PAGED_ATTN_CROSS_INSTALL=1   as root: apt-get install g++-aarch64-linux-gnu qemu-user if missing
#      PAGED_ATTN_CROSS_BUILD=DIR   where binaries (and default cases) go; default build/cross
#      PYTHON                       interpreter writing the cases; default .venv/bin/python
# Exit: 0 every build ran and passed; 1 a build or a case failed; 3 an aarch64 run could not
#       happen (missing tools; said plainly below) though the rest passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BUILD="${PAGED_ATTN_CROSS_BUILD:-$ROOT/build/cross}"
SOURCES="csrc/cpu/isa_amx.cpp csrc/cpu/isa_avx512.cpp csrc/cpu/isa_avx2.cpp csrc/cpu/isa_neon.cpp csrc/cpu/isa_scalar.cpp
         csrc/cpu/kernel_variants.cpp csrc/cpu/work_items.cpp tests/cross/driver.cpp"
TARGETS="host arm"
case "${1:-}" in
  --host) TARGETS=host; shift ;;
  --arm) TARGETS=arm; shift ;;
  --arm-clang) TARGETS=arm-clang; shift ;;
esac
CASES="${1:-}"
status=0

# build NAME CXX FLAGS...: every source to an object in parallel, then $BUILD/NAME/driver.
build() {
  local name=$1 cxx=$2 dir="$BUILD/$1" pids=() ok=0 t0=$SECONDS
  shift 2
  mkdir -p "$dir" && rm -f "$dir"/*.o "$dir/driver"
  for src in $SOURCES; do
    "$cxx" "$@" -c "$src" -o "$dir/$(basename "${src%.cpp}").o" & pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || ok=1; done
  [ $ok = 0 ] && "$cxx" "$@" "$dir"/*.o -o "$dir/driver" || { echo "cross_test: $name build FAILED ($cxx)"; return 1; }
  echo "cross_test: built $dir/driver with $cxx in $((SECONDS - t0)) s"
}

# run NAME [RUNNER]: the driver on the cases, timed.
run() {
  local t0=$SECONDS
  ${2:-} "$BUILD/$1/driver" "$CASES" || status=1
  echo "cross_test: $1 run took $((SECONDS - t0)) s"
}

if [ -z "$CASES" ]; then
  CASES="$BUILD/cases"
  PY="${PYTHON:-$ROOT/.venv/bin/python}"
  [ -x "$PY" ] || PY=python3
  "$PY" tests/support/cross_cases.py "$CASES" || { echo "cross_test: writing cases FAILED"; exit 1; }
fi

# bench_smoke CXX FLAGS...: scripts/bench/kernel_bench.cpp linked with the host build's kernel
# objects, run once per layout on a small shape (the tool stays in step with the kernel's
# interfaces).
bench_smoke() {
  local dir="$BUILD/host" out cxx=$1
  shift
  "$cxx" "$@" -pthread -c scripts/bench/kernel_bench.cpp -o "$dir/kernel_bench.o.tool" &&
    "$cxx" -pthread $(ls "$dir"/*.o | grep -v /driver.o) "$dir/kernel_bench.o.tool" -o "$dir/kernel_bench" ||
    { echo "cross_test: kernel_bench build FAILED"; return 1; }
  for layout in vllm nhd hnd; do
    for mode in "" --read; do
      out=$("$dir/kernel_bench" --layout "$layout" --seqs 3 --ctx 600 --heads 12 --kv-heads 4 --reps 1 $mode) ||
        { echo "cross_test: kernel_bench --layout $layout $mode FAILED"; return 1; }
      echo "cross_test: $out"
    done
  done
}

if [[ " $TARGETS " == *" host "* ]]; then
  HOST="g++ -O2 -std=c++20 -I csrc"
  build host $HOST && run host && bench_smoke $HOST || status=1
fi

if [[ " $TARGETS " == *" arm "* ]]; then
  have_tools() { command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null; }
  if [ "$(uname -m)" = aarch64 ]; then
    echo "cross_test: host is aarch64: the host build runs neon natively, no emulation needed"
  else
    why="aarch64-linux-gnu-g++ / qemu-aarch64 not installed"
    if ! have_tools; then
      if [ "${PAGED_ATTN_CROSS_INSTALL:-0}" != 1 ]; then
        why="$why; not installing them: set PAGED_ATTN_CROSS_INSTALL=1 (as root) to apt-get install"
      elif [ "$(id -u)" != 0 ]; then
        why="$why; cannot install them: not root"
      else
        echo "cross_test: installing g++-aarch64-linux-gnu qemu-user (apt-get)"
        if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            g++-aarch64-linux-gnu qemu-user >/dev/null; then
          why="$why; still missing after apt-get install (not on PATH?)"
        else
          why="$why; apt-get install FAILED (see its errors above)"
        fi
      fi
    fi
    if have_tools; then
      build aarch64 aarch64-linux-gnu-g++ -static -O2 -std=c++20 -I csrc && run aarch64 qemu-aarch64 \
        || status=1
    else
      echo "cross_test: aarch64 (neon) NOT RUN: $why"
      [ $status = 0 ] && status=3
    fi
  fi
fi
if [[ " $TARGETS " == *" arm-clang "* ]]; then
  missing=""
  for tool in clang++ aarch64-linux-gnu-g++ qemu-aarch64; do
    command -v $tool >/dev/null || missing="$missing $tool"
  done
  if [ -z "$missing" ]; then
    build aarch64-clang clang++ --target=aarch64-linux-gnu -static -O2 -std=c++20 -I csrc \
      && run aarch64-clang qemu-aarch64 || status=1
  else
    echo "cross_test: aarch64 built by clang (neon) NOT RUN: missing$missing"
    [ $status = 0 ] && status=3
  fi
fi
exit $status
