#!/usr/bin/env bash
# prebuild_cuda.sh — build the extension for one GPU arch on a machine without that GPU, so that
# scripts/gpu/device_check.sh on a lent GPU machine can skip its build step (100-140 s of its device
# time on an H200 with 16 jobs; 8-15 minutes here with 2).
#
# Usage: PYTHON=<python with the GPU machine's CUDA torch> bash scripts/gpu/prebuild_cuda.sh [out dir]
#        (default out dir: prebuilt/, ignored by git; carry it to the GPU machine)
# Env:   ARCH      TORCH_CUDA_ARCH_LIST of the GPU (default 9.0, the H200)
#        MAX_JOBS  parallel compile jobs (default: the cores here)
# Builds HEAD's committed tree (git archive: what the GPU machine's checkout holds when the
# working tree is clean) in a temporary folder and writes <out>/_C.abi3.so.gz and <out>/stamp:
#   csrc_tree <git tree id of HEAD's csrc/>    torch <torch.__version__ of PYTHON>    arch <ARCH>
# device_check.sh (PREBUILT=<out>) unpacks it only when all three match the machine it runs on.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:-$ROOT/prebuilt}"
PY="${PYTHON:-python3}"
ARCH="${ARCH:-9.0}"
cd "$ROOT"
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"
"$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else "PYTHON has a CPU-only torch")'
CSRC_TREE="$(git rev-parse HEAD:csrc)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git archive HEAD | tar -x -C "$WORK"
echo "prebuild_cuda.sh: building HEAD ($(git rev-parse --short HEAD)) for sm_${ARCH/./} with" \
     "torch $TORCH_VERSION in $WORK"
(cd "$WORK" && MAX_JOBS="${MAX_JOBS:-$(nproc)}" TORCH_CUDA_ARCH_LIST="$ARCH" \
   PAGED_ATTN_BUILD_CUDA=1 PAGED_ATTN_CUDA_BASELINE=1 PAGED_ATTN_CUDA_LINEINFO=1 \
   "$PY" setup.py build_ext --inplace > "$WORK/build.log" 2>&1) ||
  { tail -n 30 "$WORK/build.log" >&2; echo "prebuild_cuda.sh: the build failed" >&2; exit 1; }
mkdir -p "$OUT_DIR"
gzip -c "$WORK/paged_attention_ext/_C.abi3.so" > "$OUT_DIR/_C.abi3.so.gz"
printf 'csrc_tree %s\ntorch %s\narch %s\n' "$CSRC_TREE" "$TORCH_VERSION" "$ARCH" > "$OUT_DIR/stamp"
echo "prebuild_cuda.sh: wrote $OUT_DIR/_C.abi3.so.gz and $OUT_DIR/stamp:"
cat "$OUT_DIR/stamp"
