#!/usr/bin/env bash
# CI's CUDA build (no GPU needed): in a copy of the tree (build/cuda) and a venv of its own
# (build/cuda-venv, torch's CUDA build), the whole extension for one arch as the default build
# makes it (the baseline kernel, PAGED_ATTN_CUDA_BASELINE=1, is compiled for every arch by
# scripts/ci/cuda_arch_smoke.sh) with nvcc's register / spill report; then the resource report
# from that build (0 spills, every kernel there), and the tests
# that read a CUDA build (build_info, the arch list against the fatbin's images, loading, the
# registry, the CUDA tests' collection and skips). The main build and .venv are untouched.
#
# Usage: scripts/ci/cuda_build.sh [--venv-only]   (--venv-only: set up build/cuda-venv and stop;
#        .ci/run does that in the background while the CPU steps run)
# Env: CUDA_TORCH   default torch==2.14.1;  CUDA_ARCH   default 9.0 (the GPU the device checks use)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
COPY="$ROOT/build/cuda"
VENV="$ROOT/build/cuda-venv"
ARCH="${CUDA_ARCH:-9.0}"
command -v nvcc >/dev/null || { echo "cuda_build.sh: no nvcc on PATH"; exit 1; }

if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
t0=$SECONDS
"$PY" -m pip install -q --disable-pip-version-check "${CUDA_TORCH:-torch==2.14.1}" pytest \
  pytest-xdist hypothesis numpy ninja "setuptools>=77" wheel rich 2>&1 | grep -v '^WARNING: Location' || true
"$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else "not a CUDA build of torch")'
echo "cuda_build: torch $("$PY" -c 'import torch; print(torch.__version__)') in $((SECONDS - t0)) s"
[[ "${1:-}" == --venv-only ]] && exit 0

bash "$ROOT/scripts/ci/copy_tree.sh" "$COPY"
cd "$COPY"
t0=$SECONDS
LOG="$COPY/build.log"
env PATH="$VENV/bin:$PATH" MAX_JOBS="${MAX_JOBS:-$(nproc)}" PAGED_ATTN_BUILD_CUDA=1 \
  TORCH_CUDA_ARCH_LIST="$ARCH" PAGED_ATTN_PTXAS_VERBOSE=1 \
  "$PY" setup.py build_ext --inplace > "$LOG" 2>&1 \
  || { tail -n 40 "$LOG"; echo "cuda_build: the CUDA build FAILED (log: $LOG)"; exit 1; }
echo "cuda_build: built for $ARCH in $((SECONDS - t0)) s:" \
     "$(du -h paged_attention_ext/_C*.so | cut -f1) _C"

echo "cuda_build: nvcc's resource report of this build"
FROM_LOG="$LOG" bash scripts/ci/cuda_resource_report.sh "$ROOT/build/cuda_resource_report.txt"

"$PY" -c "
import paged_attention_ext as pa
b = pa.build_info()
assert b['cuda'] and b['cuda_baseline_kernel'] == 'below sm_80 only', b
print('cuda_build: _C loads:', b['cuda_archs'], 'baseline on', b['cuda_baseline_kernel'])"
workers="$(nproc)"; ((workers > 8)) && workers=8
"$PY" -m pytest -q -rs -p no:cacheprovider -n "$workers" -m "not slow" \
  tests/test_build_info.py tests/test_cuda_arch.py tests/test_extension_load.py \
  tests/test_registry.py tests/test_cuda_kernels.py tests/test_bad_input.py
