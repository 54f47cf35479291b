#!/usr/bin/env bash
# cuda_arch_smoke.sh — CI's check of every arch of the default list: one instantiation file of
# each kernel family, compiled for each arch with `ptxas -v` as a PAGED_ATTN_CUDA_BASELINE=1 build
# (the baseline kernel for every arch), must compile, hold every family for every arch, and spill
# nothing (scripts/ci/cuda_resource_report.sh does the compiling and
# the spill check). About a minute of CPU on CI's 2 cores for the defaults.
#
# Usage: scripts/ci/cuda_arch_smoke.sh [output file]      (default build/cuda_arch_smoke.txt)
# Env:   SMOKE_ARCHS  default "7.5;8.0;9.0;10.0;12.0": the archs of the default build list
#                     (build_helpers/cuda_build.py); CI's CUDA build compiles every
#                     file for 9.0 (scripts/ci/cuda_build.sh)
#        SMOKE_FILES  default "attention_bfloat16_auto*.cu attention_bfloat16_fp8e4m3_d8.cu
#                     reshape_and_cache.cu" (globs of names
#                     in csrc/cuda or among the files generated from dispatch.cuh's lists):
#                     attention_bfloat16_auto_d<N>.cu hold the attention kernels of every head
#                     size group (baseline, pipelined and its tensor-core form; below sm_80 the
#                     pipelined ones are a trap, csrc/cuda/kernel_families.h, so there only the
#                     baseline is checked) and attention_bfloat16_auto.cu the v2 reduce kernel of one
#                     dtype (the first pair of each dtype instantiates the reduce kernel; bf16:
#                     its conversions are emulated before sm_80, so sm_75 compiles other code
#                     than CI's main build); attention_bfloat16_fp8e4m3_d8.cu one group on an fp8
#                     cache (decoded in software before sm_89, by the hardware from sm_89), the
#                     head-256 group: the most registers (where sm_100 / sm_120 once spilled);
#                     reshape_and_cache.cu holds every reshape_and_cache kernel.
#        JOBS, NVCC   as in cuda_resource_report.sh
# Needs nvcc; no GPU, no torch. Exit status non-zero on a compile error, a spill, or a family
# missing for an arch.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/build/cuda_arch_smoke.txt}"
ARCHS="${SMOKE_ARCHS:-7.5;8.0;9.0;10.0;12.0}"
FILES="${SMOKE_FILES:-attention_bfloat16_auto*.cu attention_bfloat16_fp8e4m3_d8.cu reshape_and_cache.cu}"
mkdir -p "$(dirname "$OUT")"

TORCH_CUDA_ARCH_LIST="$ARCHS" ONLY="$FILES" bash "$ROOT/scripts/ci/cuda_resource_report.sh" "$OUT"

# Every family compiled for every arch (the report lists one row per kernel and arch).
python3 - "$OUT" "$ARCHS" <<'PY'
import sys
out, archs = sys.argv[1:3]
def tensor_cores(name):  # the pipelined kernel's last template argument, kMma, is true
    return name.rstrip().endswith(", true>") or "Lb1EE" in name  # demangled or mangled


families = {
    "paged_attention_kernel": lambda n: "paged_attention_kernel" in n,
    "paged_attention_pipelined_kernel": lambda n: "paged_attention_pipelined_kernel" in n
    and not tensor_cores(n),
    "pipelined kernel on tensor cores": lambda n: "paged_attention_pipelined_kernel" in n
    and tensor_cores(n),
    "paged_attention_v2_reduce_kernel": lambda n: "paged_attention_v2_reduce_kernel" in n,
    "reshape_and_cache_kernel": lambda n: "reshape_and_cache_kernel" in n,
}
rows = [line.split(None, 6) for line in open(out) if not line.startswith("#")][1:]
missing = []
for arch in archs.split(";"):
    sm = "sm_" + arch.replace("+PTX", "").replace(".", "")
    names = [r[6] for r in rows if r[0] == sm]
    for family, member in families.items():
        if "pipelined" in family and int(sm[3:]) < 80:
            continue  # a trap there (kernel_families.h): no code to check
        count = sum(1 for n in names if member(n))
        print(f"{sm:7} {family:34} {count:3d} kernels")
        if count == 0:
            missing.append(f"{family} for {sm}")
if missing:
    sys.exit("cuda_arch_smoke.sh: not compiled: " + ", ".join(missing))
PY
