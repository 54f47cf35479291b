#!/usr/bin/env bash
# cuda_resource_report.sh — compile every CUDA kernel file with `-Xptxas=-v` and write the
# per-kernel resource report (registers, stack, spills, shared memory) for each arch.
#
# Usage: scripts/ci/cuda_resource_report.sh [output file]   (default build/cuda_resource_report.txt;
#        CI writes it from its CUDA build, scripts/ci/cuda_build.sh)
# Env:   TORCH_CUDA_ARCH_LIST (default: the build's default list, DEFAULT_ARCH_LIST in
#        build_helpers/cuda_build.py), NVCC (default nvcc on PATH or /usr/local/bin),
#        JOBS (parallel nvcc processes, default 2), ONLY (space-separated globs of .cu names,
#        default all),
#        FROM_LOG (parse this build log instead of compiling, e.g. the output of
#        `PAGED_ATTN_PTXAS_VERBOSE=1 python setup.py build_ext --inplace`: the real build's flags).
# Compiled as a build with PAGED_ATTN_CUDA_BASELINE=1 (csrc/cuda/kernel_families.h: the baseline
# kernel in every arch's code, as CI and the GPU check build it). Needs no GPU and no torch: the kernel files include only csrc/ headers and the CUDA toolkit
# (and a host C++ compiler, CXX or c++, for the expected kernel count).
# Exits non-zero when any kernel spills (the project's rule: 0 bytes spill everywhere), when a
# kernel's ptxas lines cannot be parsed, or when an arch's kernel count differs from the count the
# instantiation lists give (below: "expected kernels").
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/build/cuda_resource_report.txt}"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/bin/nvcc)}"
DEFAULT_ARCHS="$(sed -n 's/^DEFAULT_ARCH_LIST = "\(.*\)"$/\1/p' "$ROOT/build_helpers/cuda_build.py")"
ARCHS="${TORCH_CUDA_ARCH_LIST:-$DEFAULT_ARCHS}"
JOBS="${JOBS:-2}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# The kernel files (the torch glue is ops_cuda.cpp, not compiled here): csrc/cuda/*.cu and the attention
# instantiation files the build generates from dispatch.cuh's pair list (written here into $GEN).
GEN="$WORK/generated"
python3 "$ROOT/csrc/cuda/generate_instantiations.py" "$GEN" > /dev/null
FILES=()
read -ra GLOBS <<< "${ONLY:-*.cu}"  # NOTE: read -a does not expand the globs in the cwd
shopt -s nullglob
for glob in "${GLOBS[@]}"; do
  matched=0
  for f in "$ROOT"/csrc/cuda/$glob "$GEN"/$glob; do
    [[ -f "$f" ]] || continue  # a name without wildcards stays even when no such file exists
    matched=1
    FILES+=("$f")
  done
  (( matched )) || { echo "cuda_resource_report.sh: no kernel file matches $glob" >&2; exit 2; }
done
shopt -u nullglob

# Expected kernels per arch, from the instantiation lists: attention_kernels_per_dims(dtype)
# (csrc/cuda/dispatch.cuh, every kernel family, computed by running its dispatchers) per
# AttentionDims group explicitly instantiated by a generated attention_<dtype>_<cache>_d<N>.cu
# file; one reduce kernel per explicit launch_v2_reduce instantiation; reshape_and_cache.cu: two
# kernels per query dtype of the attention files (a cache of that dtype, fp8 bytes; e4m3 and e5m2
# share the byte kernel). A launcher file must instantiate all three launchers (baseline,
# pipelined, mma) for the same pairs; a whole build (FROM_LOG) must hold every pair's
# distinct_dims_per_lane() groups.
cat > "$WORK/count.cpp" <<'CPP'
#include <cstdio>
#include "cuda/dispatch.cuh"
int main() {  // "groups=G kFloat32=N kFloat16=M ...": per pair of the list, its dtype's count
  using paged_attn::ScalarKind;
  std::printf("groups=%d ", paged_attn::cuda::distinct_dims_per_lane());
#define PA_COUNT(S, C) \
  std::printf("%s=%d ", #S, paged_attn::cuda::attention_kernels_per_dims(ScalarKind::S));
  PAGED_ATTN_CUDA_PAIRS(PA_COUNT)
  std::printf("\n");
}
CPP
"${CXX:-c++}" -std=c++17 -I"$ROOT/csrc" "$WORK/count.cpp" -o "$WORK/count"
PER_GROUP="$("$WORK/count")"
if [[ -n "${FROM_LOG:-}" ]]; then
  FILES=("$ROOT"/csrc/cuda/*.cu "$GEN"/*.cu)  # a real build compiles every kernel file
fi
EXPECTED="$(python3 - "$PER_GROUP" "$GEN" "${FROM_LOG:+whole}" "${FILES[@]}" <<'PY'
import collections, glob, os, re, sys
per_group = {k: int(v) for k, v in (item.split("=") for item in sys.argv[1].split())}
groups_per_pair = per_group.pop("groups")
gen_dir, whole, files = sys.argv[2], sys.argv[3] == "whole", sys.argv[4:]
launcher = r"template {} {}<ScalarKind::(\w+), CacheKind::(\w+)>"
pair = re.compile(launcher.format("void", "launch_paged_attention"))
others = [re.compile(launcher.format("void", "launch_paged_attention_pipelined")),
          re.compile(launcher.format("bool", "launch_paged_attention_mma"))]
group = re.compile(r"template struct AttentionDims<ScalarKind::(\w+), CacheKind::(\w+), (\d+)>")
reduce = re.compile(r"template cudaError_t launch_v2_reduce<ScalarKind::(\w+)>")
dtypes = set()
for f in glob.glob(os.path.join(gen_dir, "attention_*.cu")):
    dtypes |= {m.group(1) for m in pair.finditer(open(f).read())}
total = 0
groups_seen = collections.Counter()
for f in files:
    text = open(f).read()
    pairs = sorted(pair.findall(text))
    if any(sorted(other.findall(text)) != pairs for other in others):
        sys.exit(f"{f}: the baseline, pipelined and mma launchers are not instantiated for the "
                 "same pairs")
    for scalar, cache, dims in group.findall(text):
        groups_seen[scalar, cache] += 1
        total += per_group[scalar]
    total += len(reduce.findall(text))
    if os.path.basename(f) == "reshape_and_cache.cu":
        total += 2 * len(dtypes)
if whole:
    short = {p: n for p, n in groups_seen.items() if n != groups_per_pair}
    launched = {p for f in files for p in pair.findall(open(f).read())}
    short.update({p: groups_seen[p] for p in launched if groups_seen[p] != groups_per_pair})
    if short:
        sys.exit("kernel groups per pair differ from dispatch.cuh's distinct_dims_per_lane() = "
                 f"{groups_per_pair}: {dict(short)}")
print(total)
PY
)"

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
  "'"$NVCC"'" -std=c++20 -O3 --expt-relaxed-constexpr -DPAGED_ATTN_CUDA_BASELINE \
    -gencode "arch=compute_$sm,code=sm_$sm" \
    -Xptxas=-v -I"'"$ROOT"'/csrc" -c "$f" -o /dev/null > "$log" 2>&1 || { cat "$log"; exit 255; }'
elapsed=$(( $(date +%s) - start ))

# ptxas prints, per kernel: "Compiling entry function 'NAME' for 'sm_XX'", then
# "N bytes stack frame, N bytes spill stores, N bytes spill loads", then "Used N registers, ...",
# which names "N bytes smem" only when the kernel has shared memory (reshape_and_cache has none).
# Every "Compiling entry function" must end in a row: a kernel whose lines do not parse is an
# error, never a kernel left out of the count.
python3 - "$WORK" "$OUT" "$elapsed" "$NVCC" "$EXPECTED" "$ARCHS" <<'PY'
import collections, glob, os, re, subprocess, sys
work, out, elapsed, nvcc = sys.argv[1:5]
expected = int(sys.argv[5])
rows = []
entries = collections.Counter()  # arch -> "Compiling entry function" lines
unparsed = []
for log in sorted(glob.glob(os.path.join(work, "*.log"))):
    name = arch = None
    stack = spill_st = spill_ld = None
    for line in open(log):
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            if name:
                unparsed.append((arch, name))
            name, arch = m.group(1), m.group(2)
            entries[arch] += 1
            stack = spill_st = spill_ld = None
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            stack, spill_st, spill_ld = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            if stack is None:  # no "bytes stack frame" line: spills unknown
                unparsed.append((arch, name))
                name = None
                continue
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((os.path.basename(log).split(".")[0], arch, name, int(m.group(1)), stack,
                         spill_st, spill_ld, int(smem.group(1)) if smem else 0))
            name = None
    if name:
        unparsed.append((arch, name))
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
source = os.environ.get("FROM_LOG")
per_arch = collections.Counter(r[1] for r in rows)
archs = sorted(per_arch)
if sys.argv[6]:  # the archs asked for (direct compile); a build log names its own
    archs = sorted({"sm_" + a.replace("+PTX", "").replace(".", "") for a in sys.argv[6].split(";")})
wrong_count = [a for a in archs if per_arch[a] != expected]
version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
with open(out, "w") as f:
    f.write("# CUDA kernel resource report (ptxas -v), written by scripts/ci/cuda_resource_report.sh\n")
    f.write(f"# nvcc: {version}\n")
    f.write(f"# source: {'build log ' + os.path.basename(source) if source else 'direct nvcc -O3 per .cu file'}\n")
    f.write(f"# kernels: {len(rows)} ({', '.join(f'{a}: {per_arch[a]}' for a in archs)}; "
            f"expected per arch from the instantiation lists: {expected})  "
            f"spilling: {len(spilling)}  "
            + ("(parsed from the build's log)\n" if source else f"compile wall time: {elapsed} s\n"))
    f.write("# attention kernel template args: <Scalar, cache, kDimsPerLane, kHeadTile, warp, warps"
            "[, kMma: the pipelined kernel on tensor cores]>\n")
    f.write(f"{'arch':7} {'regs':>4} {'stack':>5} {'spill_st':>8} {'spill_ld':>8} {'smem':>6}  kernel\n")
    for file, arch, name, regs, stack, st, ld, smem in sorted(rows, key=lambda r: (r[1], short(r[2]))):
        f.write(f"{arch:7} {regs:4d} {stack:5d} {st:8d} {ld:8d} {smem:6d}  {short(name)}\n")
print(f"{len(rows)} kernels ({', '.join(f'{a}: {per_arch[a]}' for a in archs)}; expected "
      f"{expected} per arch), {len(spilling)} spilling, {elapsed} s -> {out}")
for r in spilling:
    print("SPILL", r[1], short(r[2]), r[5], r[6])
for arch, name in unparsed:
    print("UNPARSED ptxas lines of", arch, short(name))
for a in wrong_count:
    print(f"COUNT {a}: {per_arch[a]} kernels in the report, {expected} expected from the "
          "instantiation lists")
if not archs:
    print("no kernel found in the ptxas output")
sys.exit(1 if spilling or unparsed or wrong_count or not archs or not rows else 0)
PY
