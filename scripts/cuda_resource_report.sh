#!/usr/bin/env bash
# cuda_resource_report.sh — compile every CUDA kernel file with `-Xptxas=-v` and write the
# per-kernel resource report (registers, stack, spills, shared memory) for each arch.
#
# Usage: scripts/cuda_resource_report.sh [output file]   (default docs/cuda_resource_report.txt)
# Env:   TORCH_CUDA_ARCH_LIST (default: the build's default list, DEFAULT_ARCH_LIST in
#        paged_attention_ext/cuda_arch.py), NVCC (default nvcc on PATH or /usr/local/bin),
#        JOBS (parallel nvcc processes, default 2), ONLY (space-separated globs of .cu names,
#        default all),
#        FROM_LOG (parse this build log instead of compiling, e.g. the output of
#        `PAGED_ATTN_PTXAS_VERBOSE=1 python setup.py build_ext --inplace`: the real build's flags).
# Needs no GPU and no torch: the kernel files include only csrc/ headers and the CUDA toolkit.
# Exits non-zero when any kernel spills (the project's rule: 0 bytes spill everywhere).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/docs/cuda_resource_report.txt}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/bin/nvcc)}"
DEFAULT_ARCHS="$(sed -n 's/^DEFAULT_ARCH_LIST = "\(.*\)"$/\1/p' "$ROOT/paged_attention_ext/cuda_arch.py")"
ARCHS="${TORCH_CUDA_ARCH_LIST:-$DEFAULT_ARCHS}"
JOBS="${JOBS:-2}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The torch-free kernel files (ops_cuda.cu holds only host glue).
FILES=()
read -ra GLOBS <<< "${ONLY:-*.cu}"  # NOTE: read -a does not expand the globs in the cwd
for glob in "${GLOBS[@]}"; do
  for f in "$ROOT"/csrc/cuda/$glob; do
    [[ -f "$f" ]] || { echo "cuda_resource_report.sh: no file matches csrc/cuda/$glob" >&2; exit 2; }
    [[ "$(basename "$f")" == ops_cuda.cu ]] || FILES+=("$f")
  done
done

start=$(date +%s)
if [[ -n "${FROM_LOG:-}" ]]; then
  cp "$FROM_LOG" "$WORK/build.log"
  ARCHS=""
fi
IFS=';' read -ra ARCH_ARR <<< "$ARCHS"
for arch in "${ARCH_ARR[@]}"; do
  sm="${arch//./}"; sm="${sm%%+PTX}"
  for f in "${FILES[@]}"; do
    [[ -n "$sm" ]] && echo "$sm $f"
  done
done | xargs -r -P "$JOBS" -L 1 bash -c '
  sm=$0; f=$1; log="'"$WORK"'/$(basename "$f" .cu).sm_$sm.log"
  "'"$NVCC"'" -std=c++20 -O3 --expt-relaxed-constexpr -gencode "arch=compute_$sm,code=sm_$sm" \
    -Xptxas=-v -I"'"$ROOT"'/csrc" -c "$f" -o /dev/null > "$log" 2>&1 || { cat "$log"; exit 255; }'
elapsed=$(( $(date +%s) - start ))

# ptxas prints, per kernel: "Compiling entry function 'NAME' for 'sm_XX'", then
# "N bytes stack frame, N bytes spill stores, N bytes spill loads", then "Used N registers, ...",
# which names "N bytes smem" only when the kernel has shared memory (reshape_and_cache has none).
python3 - "$WORK" "$OUT" "$elapsed" "$NVCC" <<'PY'
import glob, os, re, subprocess, sys
work, out, elapsed, nvcc = sys.argv[1:5]
rows = []
for log in sorted(glob.glob(os.path.join(work, "*.log"))):
    name = arch = None
    stack = spill_st = spill_ld = None
    for line in open(log):
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            name, arch = m.group(1), m.group(2)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            stack, spill_st, spill_ld = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((os.path.basename(log).split(".")[0], arch, name, int(m.group(1)), stack,
                         spill_st, spill_ld, int(smem.group(1)) if smem else 0))
            name = None
names = sorted({r[2] for r in rows})
try:
    demangled = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                               text=True).stdout.splitlines()
    pretty = dict(zip(names, demangled))
except OSError:
    pretty = {}
def short(n):
    s = pretty.get(n, n)
    s = re.sub(r"paged_attn::(cuda::)?", "", s)
    s = re.sub(r"\((const )?PagedAttentionParams.*$|\((const )?ReshapeAndCacheParams.*$", "", s)
    s = s.replace("void ", "")
    s = s.replace("(CacheKind)0", "auto").replace("(CacheKind)1", "fp8e4m3").replace("(CacheKind)2", "fp8e5m2")
    s = s.replace("__nv_bfloat16", "bf16").replace("__half", "f16").replace("unsigned char", "u8")
    return s
spilling = [r for r in rows if r[5] or r[6]]
version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
with open(out, "w") as f:
    f.write("# CUDA kernel resource report (ptxas -v), written by scripts/cuda_resource_report.sh\n")
    f.write(f"# nvcc: {version}\n")
    source = os.environ.get("FROM_LOG")
    f.write(f"# source: {'build log ' + os.path.basename(source) if source else 'direct nvcc -O3 per .cu file'}\n")
    f.write(f"# kernels: {len(rows)}  spilling: {len(spilling)}  compile wall time: {elapsed} s\n")
    f.write("# attention kernel template args: <Scalar, cache, kDimsPerLane, kHeadTile, warp, warps>\n")
    f.write(f"{'arch':7} {'regs':>4} {'stack':>5} {'spill_st':>8} {'spill_ld':>8} {'smem':>6}  kernel\n")
    for file, arch, name, regs, stack, st, ld, smem in sorted(rows, key=lambda r: (r[1], short(r[2]))):
        f.write(f"{arch:7} {regs:4d} {stack:5d} {st:8d} {ld:8d} {smem:6d}  {short(name)}\n")
print(f"{len(rows)} kernels, {len(spilling)} spilling, {elapsed} s -> {out}")
for r in spilling:
    print("SPILL", r[1], short(r[2]), r[5], r[6])
sys.exit(1 if spilling or not rows else 0)
PY
