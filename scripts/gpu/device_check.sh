#!/usr/bin/env bash
# device_check.sh — build and check the CUDA kernels on a machine with an NVIDIA GPU.
#
# Usage: scripts/gpu/device_check.sh [output dir]     (default: $OUT if set, else ./device-out)
# Env:   PYTHON  a python with a CUDA torch (default: the repo's .venv if present, else python3)
#        The build needs setuptools >= 77 (pyproject.toml's SPDX license). On an offline machine
#        whose python has an older one, put a setuptools wheel in <repo>/.whl/ (e.g.
#        `pip download --no-deps -d .whl 'setuptools>=77'`, with /.whl/ in .git/info/exclude): it
#        is installed into a temporary folder on PYTHONPATH for this check; without one the
#        check stops before building, saying so. WHEELS  that folder (default <repo>/.whl)
#        CHECK_BUDGET  seconds for the whole check (default 450)
#        PREBUILT      a folder written by scripts/gpu/prebuild_cuda.sh (the extension built
#                      elsewhere for this GPU's arch): the build step unpacks it instead of
#                      building (row "unpack_prebuilt") when its stamp matches this checkout's
#                      committed csrc/ (clean), the python's torch and the GPU's arch; else it
#                      builds, saying why the prebuilt one was not used
#        CHECK_STEPS   comma-separated steps to run (default build,tests,check,sanitizer,bench,
#                      profile):
#                      e.g. a second call on a machine that kept the first call's build can run
#                      CHECK_STEPS=bench alone; a step left out is a "not selected" row
#
# Steps, each under its own time limit AND the whole script under one budget: CHECK_BUDGET
# seconds (default 450, so the check ends within 8 minutes whatever hangs); a step gets
# min(its limit, what is left), and a step with under 15 s left is not started (row "skipped").
# The limits of steps 2-5 add up to 440 s, the default budget less the GPU probe and one
# step's kill margin; the benchmarks (step 6) get only what steps 1-5 leave unused. So when time
# runs out the benchmarks are cut first, in reverse order (the baseline kernel's, then fp8, ...),
# then synccheck, racecheck, memcheck; a smaller CHECK_BUDGET cuts the last of steps 2-5 too.
#   1. GPU present? (nvidia-smi and torch.cuda.is_available(); exits 3 at once if not)
#   2. build the extension with all cores for this GPU's arch only (MAX_JOBS=16,
#      TORCH_CUDA_ARCH_LIST from the device capability), ptxas resource report in the log (150 s)
#   3. tests/test_cuda_kernels.py, the CUDA params of tests/test_conformance.py (each kernel choice
#      against the oracle), tests/test_warp_reduce_host.py, tests/test_cuda_arch.py (the
#      arch check's first call on each GPU), the CUDA cases of the fallback tests (CUDA-graph
#      replay of the PyTorch implementation) and of tests/test_blocksparse.py (140 s)
#   4. python -m paged_attention_ext check (every backend on this machine vs the oracle) (20 s)
#   5. compute-sanitizer on python -m paged_attention_ext.tools.sanitizer_cases (every CUDA
#      kernel path once, small inputs, each result against the oracle, once per CUDA attention
#      kernel): memcheck (--leak-check no; 50 s), racecheck on its --quick cases (40 s),
#      synccheck (40 s); each exits non-zero on any finding (--error-exitcode 1) or mismatch.
#      Run with PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor its own cudaMalloc, so memcheck
#      sees a read past a tensor's end (torch's caching allocator would hide it inside a pooled
#      block). compute-sanitizer is looked for on PATH, then in $CUDA_HOME/bin and
#      /usr/local/cuda/bin; without it the three rows say "SKIPPED (no compute-sanitizer)" and
#      count as failed.
#   6. the benchmark, python -m paged_attention_ext bench --device cuda, on the regime presets
#      of docs/CUDA.md's performance model (big-batch, small-batch, gqa8, tp8-kv1, long), for
#      --kv-layout vllm (v1, v2) and nhd (decode), then the fp8 cache (--kv-cache-dtype fp8) on
#      big-batch and small-batch for both layouts: ours vs SDPA (flash) on contiguous K/V vs
#      the PyTorch fallback vs the oracle, each checked against the oracle, GB/s and % of the
#      read bandwidth measured in the same run; all with the default CUDA attention kernel (mma on
#      sm_80+: tensor cores for these bf16 GQA presets), then ours alone with
#      PAGED_ATTN_CUDA_KERNEL=pipelined (CUDA-core math) and =baseline on the same presets
#      (bench_*_pipelined, bench_*_baseline), to compare the kernels (45 s each, 30 s for the
#      ours-only ones); then ours and SDPA again with --kernel-times (bench_kernels_vllm / _nhd:
#      each call's kernels and their own times from torch.profiler); ours with the split's
#      reduce launched programmatically (bench_vllm_pdl: PAGED_ATTN_CUDA_PDL=1); v1 alone under
#      the split plans of SPLIT_SWEEP (bench_split_<value>: PAGED_ATTN_CUDA_SPLIT, 30 s each);
#      in the order: vLLM layout (default, pipelined, baseline), NHD, the kernel times, PDL,
#      fp8, the split sweep, then the NHD pipelined / baseline runs. Every CUDA time is the
#      GPU's alone (the bench keeps the host's part of a call out of it: "host ms")
#   7. Nsight Compute (ncu --set full, clocks left alone) on one attention launch of big-batch
#      per layout and one of small-batch on vLLM's layout, the default kernel: profile_vllm /
#      profile_nhd / profile_small_vllm .log (details page) and .ncu-rep (60 s each; no ncu:
#      rows "SKIPPED (no ncu)", counted as failed)
#   (step 3 runs the kernel tests once per kernel choice: tests/test_cuda_kernels.py's kernel_ops,
#   tests/test_conformance.py's cuda-<kernel> params)
# Writes <out>/<step>.log, <out>/bench_<layout>[_fp8].{md,json} and <out>/results.md (one row
# per step) (the ptxas report is inside build.log); with BUNDLE=1 (default when <out> is $OUT)
# only <out>/results.md and <out>/device_check.tgz holding them all.
# No network is needed. Exit status: 0 when every step passed, else the number of failed steps
# (3 when there is no GPU).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:-${OUT:-$ROOT/device-out}}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
# BUNDLE=1 (the default when the output dir is $OUT, as on a lent GPU machine, which sends back
# at most 8 files): the step files go to a temporary folder, and on any exit the output dir gets
# only results.md and device_check.tgz (every file). BUNDLE=0: the files themselves.
if [[ "${BUNDLE:-}" == 1 || ( -z "${BUNDLE:-}" && -n "${OUT:-}" &&
      "$OUT_DIR" == "$(cd "$OUT" 2>/dev/null && pwd)" ) ]]; then
  DEST_DIR="$OUT_DIR"
  OUT_DIR="$(mktemp -d)"
  trap 'cp "$OUT_DIR/results.md" "$DEST_DIR/" 2>/dev/null
        tar czf "$DEST_DIR/device_check.tgz" -C "$OUT_DIR" .' EXIT
fi
cd "$ROOT"
export PAGED_ATTN_REQUIRE_EXTENSION=1  # step 2 builds _C: a later step must not fall back silently

if [[ -n "${PYTHON:-}" ]]; then
  PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then
  PY="$ROOT/.venv/bin/python"
else
  PY="python3"
fi

SCRIPT_START=$(date +%s)
BUDGET="${CHECK_BUDGET:-450}"
KILL_AFTER=5     # seconds between a step's TERM and KILL
MIN_STEP=15      # a step with less time left than this is not started

RESULTS="$OUT_DIR/results.md"
{
  echo "# device_check.sh results"
  echo
  echo "host $(hostname), $(date -u +%Y-%m-%dT%H:%M:%SZ), python: $PY, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo
  echo "| step | status | seconds | log |"
  echo "|---|---|---|---|"
} > "$RESULTS"
FAILED=0

# selected STEP: whether CHECK_STEPS names the step (a "not selected" row when it does not)
STEPS=",${CHECK_STEPS:-build,tests,check,sanitizer,bench,profile},"
selected() {
  [[ "$STEPS" == *",$1,"* ]] && return 0
  echo "== $1: not selected (CHECK_STEPS=${CHECK_STEPS:-})"
  echo "| $1 | not selected | 0 | |" >> "$RESULTS"
  return 1
}

# run_step NAME TIMEOUT_SECONDS COMMAND... : runs with a time limit (the step's, cut to what is
# left of the budget), logs, adds a results row.
run_step() {
  local name="$1" limit="$2"
  shift 2
  local log="$OUT_DIR/$name.log" start status
  start=$(date +%s)
  local left=$(( BUDGET - (start - SCRIPT_START) - KILL_AFTER ))
  if (( left < MIN_STEP )); then
    echo "== $name: skipped, ${left}s left of the ${BUDGET}s budget"
    echo "| $name | SKIPPED (time budget) | 0 | |" >> "$RESULTS"
    FAILED=$((FAILED + 1))
    return 124
  fi
  (( limit > left )) && limit=$left
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after="$KILL_AFTER" "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local secs=$(( $(date +%s) - start ))
  if [[ $rc -eq 0 ]]; then
    status="ok"
  elif [[ $rc -eq 124 || $rc -eq 137 ]]; then
    status="TIMEOUT"
    FAILED=$((FAILED + 1))
  else
    status="FAILED (rc $rc)"
    FAILED=$((FAILED + 1))
  fi
  echo "   -> $status in ${secs}s (log: $log)"
  tail -n 5 "$log" | sed 's/^/   | /'
  echo "| $name | $status | $secs | $(basename "$log") |" >> "$RESULTS"
  return $rc
}

# ---- 1. GPU present? fail fast and clearly when not ----
if ! command -v nvidia-smi > /dev/null 2>&1 || ! timeout -k 5 15 nvidia-smi -L > "$OUT_DIR/gpu.log" 2>&1; then
  echo "device_check.sh: no NVIDIA GPU here (nvidia-smi missing or failing); nothing to check." >&2
  echo "| gpu | NO GPU (nvidia-smi) | 0 | gpu.log |" >> "$RESULTS"
  exit 3
fi
ARCH=$(timeout -k 5 45 "$PY" -c "
import torch, sys
if not torch.cuda.is_available():
    sys.exit('torch.cuda.is_available() is False (torch ' + torch.__version__ + ', CUDA ' + str(torch.version.cuda) + ')')
major, minor = torch.cuda.get_device_capability()
print(f'{major}.{minor}')
" 2>> "$OUT_DIR/gpu.log")
if [[ -z "$ARCH" ]]; then
  echo "device_check.sh: $PY cannot use the GPU: $(tail -n 1 "$OUT_DIR/gpu.log")" >&2
  echo "| gpu | NO GPU (torch) | 0 | gpu.log |" >> "$RESULTS"
  exit 3
fi
# What the build and the figures depend on, in the log: python, torch, setuptools, nvcc.
"$PY" -c "
import sys, torch, setuptools
print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda,
      '|', torch.cuda.get_device_name(0), '| setuptools', setuptools.__version__)
" >> "$OUT_DIR/gpu.log" 2>&1
NVCC_BIN="$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")"
{ "$NVCC_BIN" --version | tail -n 1; } >> "$OUT_DIR/gpu.log" 2>&1
cat "$OUT_DIR/gpu.log"
# setup.py needs setuptools >= 77: take a carried wheel (see Env above) when the python's is older.
WHEELS="${WHEELS:-$ROOT/.whl}"
if ! "$PY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)"
then
  WHEEL=$(ls "$WHEELS"/setuptools-*.whl 2>/dev/null | tail -n 1)
  if [[ -z "$WHEEL" ]] || ! "$PY" -m pip install -q --no-index --no-deps \
      --target /tmp/pa-setuptools "$WHEEL" > "$OUT_DIR/setuptools.log" 2>&1; then
    echo "device_check.sh: $PY has no setuptools >= 77 and no usable wheel in $WHEELS/" \
         "(see the usage at the top)" >&2
    echo "| gpu | setuptools < 77, no wheel in .whl/ | 0 | gpu.log |" >> "$RESULTS"
    exit 1
  fi
  export PYTHONPATH="/tmp/pa-setuptools${PYTHONPATH:+:$PYTHONPATH}"
  echo "setuptools from $(basename "$WHEEL") (the python's own is older than 77)" |
    tee -a "$OUT_DIR/gpu.log"
fi
echo "| gpu | ok: $(head -n 1 "$OUT_DIR/gpu.log" | cut -c1-60), sm_${ARCH/./} | 0 | gpu.log |" >> "$RESULTS"

# ---- 2. build for this GPU ----
# The baseline kernel (the reference the bench compares with) and -lineinfo (the profile's source
# counters) are built here, as scripts/gpu/prebuild_cuda.sh builds them.
export MAX_JOBS=16 TORCH_CUDA_ARCH_LIST="$ARCH" PAGED_ATTN_BUILD_CUDA=1 PAGED_ATTN_PTXAS_VERBOSE=1 \
  PAGED_ATTN_CUDA_BASELINE=1 PAGED_ATTN_CUDA_LINEINFO=1
if [[ -z "${CUDA_HOME:-}" && -d /usr/local/cuda ]]; then export CUDA_HOME=/usr/local/cuda; fi
# prebuilt_mismatch DIR: nothing when DIR (scripts/gpu/prebuild_cuda.sh's output) fits this machine:
# its stamp names this checkout's committed csrc/ tree (and csrc/ is clean), the python's torch
# and the GPU's arch; else the reason it does not.
prebuilt_mismatch() {
  local dir="$1" tree torch_version want
  if [[ ! -f "$dir/_C.abi3.so.gz" || ! -f "$dir/stamp" ]]; then
    echo "no $dir/_C.abi3.so.gz with its stamp"; return
  fi
  if ! tree="$(git rev-parse HEAD:csrc 2>/dev/null)"; then echo "no git checkout here"; return; fi
  if [[ -n "$(git status --porcelain -- csrc 2>/dev/null)" ]]; then
    echo "csrc/ differs from HEAD's"; return
  fi
  torch_version="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  for want in "csrc_tree $tree" "torch $torch_version" "arch $ARCH"; do
    grep -qxF "$want" "$dir/stamp" || { echo "its stamp lacks '$want'"; return; }
  done
}
if selected build; then
  WHY_NOT_PREBUILT="${PREBUILT:+$(prebuilt_mismatch "$PREBUILT")}"
  if [[ -n "${PREBUILT:-}" && -z "$WHY_NOT_PREBUILT" ]]; then
    run_step unpack_prebuilt 60 bash -c 'gzip -dc "$0/_C.abi3.so.gz" \
        > paged_attention_ext/_C.abi3.so && echo "unpacked $0: $(tr "\n" " " < "$0/stamp")"' \
      "$PREBUILT"
    BUILD_RC=$?
  else
    if [[ -n "${PREBUILT:-}" ]]; then
      echo "PREBUILT=$PREBUILT not used: $WHY_NOT_PREBUILT; building" | tee -a "$OUT_DIR/gpu.log"
    fi
    run_step build 150 "$PY" setup.py build_ext --inplace
    BUILD_RC=$?
    if [[ $BUILD_RC -eq 0 ]]; then
      echo "ptxas: $(grep -c 'Compiling entry' "$OUT_DIR/build.log") kernels compiled, $(grep -E 'spill' "$OUT_DIR/build.log" | grep -vc ' 0 bytes spill stores, 0 bytes spill loads') report lines with spills"
    fi
  fi
  if [[ $BUILD_RC -ne 0 ]]; then
    echo "device_check.sh: the build failed; see $OUT_DIR/build.log or unpack_prebuilt.log" >&2
    exit "$FAILED"
  fi
fi

# ---- 3. tests ----
# --maxfail, not -x: a first run on a GPU should show every failing case, not only the first.
# The kernel tests run once per CUDA attention kernel choice (baseline, pipelined, mma): the
# longest limit. The host test of the tensor-core math (gqa_mma.cuh) runs with them.
if selected tests; then
  run_step tests_cuda 140 "$PY" -m pytest tests/test_cuda_kernels.py tests/test_conformance.py tests/test_warp_reduce_host.py \
    tests/test_gqa_mma_host.py tests/test_cuda_arch.py tests/test_fallback.py \
    tests/test_blocksparse.py -k "cuda or graph or warp or mma" \
    -q --maxfail=30 -rs -p no:cacheprovider
fi

# ---- 4. every backend on this machine against the oracle ----
if selected check; then
  run_step check 20 "$PY" -m paged_attention_ext check
fi

# find_cuda_tool NAME [EXTRA_PATH...]: prints the first executable NAME on PATH, in
# $CUDA_HOME/bin, in /usr/local/cuda/bin, or at an EXTRA_PATH; nothing when there is none.
find_cuda_tool() {
  local name="$1" candidate
  shift
  for candidate in "$(command -v "$name" 2>/dev/null)" "${CUDA_HOME:+$CUDA_HOME/bin/$name}" \
                   "/usr/local/cuda/bin/$name" "$@"; do
    if [[ -n "$candidate" && -x "$candidate" ]]; then echo "$candidate"; return 0; fi
  done
}
# skip_missing_tool STEP TOOL: the row of a step whose tool is missing (counted as failed).
skip_missing_tool() {
  echo "== $1: SKIPPED, no $2 (PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)"
  echo "| $1 | SKIPPED (no $2) | 0 | |" >> "$RESULTS"
  FAILED=$((FAILED + 1))
}

# ---- 5. compute-sanitizer on every kernel path (paged_attention_ext/tools/sanitizer_cases.py) ----
# compute-sanitizer ships with the CUDA toolkit, next to nvcc.
SANITIZER="$(find_cuda_tool compute-sanitizer)"
# sanitizer_step NAME LIMIT SANITIZER_OPTION... -- [PROGRAM_ARGUMENT...]: the program under
# compute-sanitizer, every tensor its own cudaMalloc (PYTORCH_NO_CUDA_MEMORY_CACHING=1); exit 1
# on any finding (and the program's own 1 on a mismatch: the log says which).
sanitizer_step() {
  local name="$1" limit="$2"
  shift 2
  local tool_args=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do tool_args+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  if [[ -z "$SANITIZER" ]]; then
    skip_missing_tool "$name" compute-sanitizer
    return 1
  fi
  run_step "$name" "$limit" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
    "$SANITIZER" --error-exitcode 1 "${tool_args[@]}" \
    "$PY" -m paged_attention_ext.tools.sanitizer_cases "$@"
}
if selected sanitizer; then
  sanitizer_step sanitizer_memcheck 50 --tool memcheck --leak-check no --
  sanitizer_step sanitizer_racecheck 40 --tool racecheck -- --quick
  sanitizer_step sanitizer_synccheck 40 --tool synccheck --
fi

# ---- 6. the benchmark (paged_attention_ext/tools/bench: one harness for CPU and CUDA) ----
# bench_step NAME KV_LAYOUT CONTENDERS KV_CACHE_DTYPE PRESET...   (env KERNEL: the CUDA attention
# kernel, PAGED_ATTN_CUDA_KERNEL, read once per process; default: the rule; env SPLIT: the v1 /
# decode split's aim, PAGED_ATTN_CUDA_SPLIT; default: the plan's own; env PDL: 1 launches the
# split's reduce with programmatic dependent launch, PAGED_ATTN_CUDA_PDL; env LIMIT: seconds; env
# EXTRA: one more bench option, e.g. --kernel-times)
bench_step() {
  local name="$1" layout="$2" contenders="$3" cache="$4"
  shift 4
  local preset_args=()
  for preset in "$@"; do preset_args+=(--preset "$preset"); done
  run_step "$name" "${LIMIT:-45}" env PAGED_ATTN_CUDA_KERNEL="${KERNEL:-}" \
    PAGED_ATTN_CUDA_SPLIT="${SPLIT:-}" PAGED_ATTN_CUDA_PDL="${PDL:-}" \
    "$PY" -m paged_attention_ext bench --device cuda --quick --no-progress \
    --kv-layout "$layout" --kv-cache-dtype "$cache" --contenders "$contenders" "${preset_args[@]}" \
    ${EXTRA:+"$EXTRA"} --markdown "$OUT_DIR/$name.md" --json "$OUT_DIR/$name.json"
}
REGIMES=(big-batch small-batch gqa8 tp8-kv1 long)
# PAGED_ATTN_CUDA_SPLIT values for the split sweep ("B": aim at B blocks per SM, ":T" partitions
# of at least T tiles of 128 tokens; bench_vllm runs the default, 8:2); the plans they give the
# presets: docs/CUDA.md "Splitting the KV range" (tests/test_split_plan.py keeps the three equal)
SPLIT_SWEEP=(off 4 16 8:1 32:1)
VLLM_CONTENDERS=ours-v2,ours-v1,fallback,oracle,sdpa-dense
NHD_CONTENDERS=ours-decode,fallback,oracle,sdpa-dense
if selected bench; then
  # the other kernel choices on the same presets, ours only (the other contenders do not change)
  bench_step bench_vllm vllm "$VLLM_CONTENDERS" auto "${REGIMES[@]}"
  KERNEL=pipelined LIMIT=30 bench_step bench_vllm_pipelined vllm ours-v2,ours-v1 auto "${REGIMES[@]}"
  KERNEL=baseline LIMIT=30 bench_step bench_vllm_baseline vllm ours-v2,ours-v1 auto "${REGIMES[@]}"
  bench_step bench_nhd nhd "$NHD_CONTENDERS" auto "${REGIMES[@]}"
  # the same calls kernel by kernel (torch.profiler): the kernels' own time against the bench's
  # GPU time, and the split's reduce apart from the attention kernel
  EXTRA=--kernel-times bench_step bench_kernels_vllm vllm ours-v2,ours-v1,sdpa-dense auto \
    "${REGIMES[@]}"
  EXTRA=--kernel-times bench_step bench_kernels_nhd nhd ours-decode,sdpa-dense auto "${REGIMES[@]}"
  # the split's reduce launched with programmatic dependent launch (sm_90+), against bench_vllm
  PDL=1 LIMIT=30 bench_step bench_vllm_pdl vllm ours-v2,ours-v1 auto "${REGIMES[@]}"
  bench_step bench_vllm_fp8 vllm "$VLLM_CONTENDERS" fp8 big-batch small-batch
  bench_step bench_nhd_fp8 nhd "$NHD_CONTENDERS" fp8 big-batch small-batch
  # v1 under other split plans, ours alone: the data to set core/split_plan.h's defaults by
  for split in "${SPLIT_SWEEP[@]}"; do
    SPLIT="$split" LIMIT=30 bench_step "bench_split_${split/:/_}" vllm ours-v1 auto "${REGIMES[@]}"
  done
  KERNEL=pipelined LIMIT=30 bench_step bench_nhd_pipelined nhd ours-decode auto "${REGIMES[@]}"
  KERNEL=baseline LIMIT=30 bench_step bench_nhd_baseline nhd ours-decode auto "${REGIMES[@]}"
fi

# ---- 7. Nsight Compute on one attention launch per layout (big-batch, default kernel) ----
# Where the default kernel's time goes on each layout (DRAM against L2 throughput, excess sectors:
# docs/PERFORMANCE.md, "NVIDIA H200", found vLLM's layout L2-bound this way), and at small-batch
# (the regime furthest from its target: occupancy, bytes in flight). ncu --set full replays the
# one launch the filter picks (the 6th attention kernel of a bench run: past the oracle check and
# warm-up); clocks left alone (--clock-control none). <name>.log ends with the details page;
# <name>.ncu-rep opens in Nsight Compute.
NCU="$(find_cuda_tool ncu /opt/nvidia/nsight-compute/*/ncu)"
# profile_step NAME KV_LAYOUT CONTENDER PRESET
profile_step() {
  local name="$1" layout="$2" contender="$3" preset="$4"
  if [[ -z "$NCU" ]]; then
    skip_missing_tool "$name" ncu
    return 1
  fi
  run_step "$name" 60 bash -c '"$0" --clock-control none --set full --import-source no \
      -k "regex:^paged_attention_(pipelined_)?kernel" --launch-skip 5 --launch-count 1 \
      -f -o "$1" "$2" -m paged_attention_ext bench --device cuda --quick --no-progress \
      --preset "$5" --kv-layout "$3" --contenders "$4" \
    && "$0" --import "$1.ncu-rep" --page details --print-units base' \
    "$NCU" "$OUT_DIR/$name" "$PY" "$layout" "$contender" "$preset"
}
if selected profile; then
  profile_step profile_vllm vllm ours-v1 big-batch
  profile_step profile_nhd nhd ours-decode big-batch
  profile_step profile_small_vllm vllm ours-v1 small-batch
fi

echo
cat "$RESULTS"
for table in "$OUT_DIR"/bench_*.md; do [[ -f "$table" ]] && cat "$table"; done
exit "$FAILED"
