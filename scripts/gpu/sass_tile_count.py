#!/usr/bin/env python3
"""sass_tile_count.py — count warp-instructions along one path of a kernel's SASS.

The instruction counts per tile in docs/CUDA.md ("Counting instructions in the SASS")
come from this script. Two steps:

1. Compile one instantiation of the pipelined kernel and list its basic blocks:
     python scripts/gpu/sass_tile_count.py --kernel "__nv_bfloat16, CacheKind::kAuto, 4, 4, 32, 4, true" \
         --arch sm_90 --save /tmp/k.sass --blocks
   (--kernel: the template arguments of paged_attention_pipelined_kernel; the script writes a .cu
   that includes csrc/cuda/attention_kernel_pipelined.cuh and instantiates it, compiles it with
   `nvcc -std=c++20 -arch=<arch> -cubin -O3 --expt-relaxed-constexpr -I csrc` and disassembles it
   with `cuobjdump -sass`; CUOBJDUMP / NVCC override the tools). Or pass a saved SASS listing
   (--sass FILE). --blocks prints every basic block: address range, instruction count, its
   instruction mix and its branch; `<-- back edge` marks a branch to a lower address (a loop).

2. Read the listing, pick the path (the main tile loop: the back edge to the loop head; which
   side of each branch a full tile takes) and count it. The counts in docs/CUDA.md, for the
   kernels as compiled when they were made (nvcc 13.0.88, cuobjdump of CUDA 13.1; the addresses
   move with any change to the kernel; listings saved with --save from --kernel
   "__nv_bfloat16, CacheKind::<cache>, 4, <heads>, 32, 4, <mma>"):
     # kAuto, 4 heads, true
     python scripts/gpu/sass_tile_count.py --sass bf16_mma4.sass \
         --part loop=6000-6030 --part copies=6040-7e50 --skip 62f0-6b10 --skip 70a0-7970 \
         --part qk=7e60-8230 --part softmax=8240-8a50 --part pv=8a60-8d40 --part loop=8d50-8da0
     # kAuto, 8 heads, true (the same tile at other addresses; its copies take 3 fewer)
     python scripts/gpu/sass_tile_count.py --sass bf16_mma8.sass \
         --part loop=5f90-5fc0 --part copies=5fd0-7db0 --skip 6280-6a90 --skip 6ff0-78d0 \
         --part qk=7dc0-8190 --part softmax=81a0-89b0 --part pv=89c0-8ca0 --part loop=8cb0-8d00
     # kFp8E4M3, 4 heads, true
     python scripts/gpu/sass_tile_count.py --sass fp8_mma4.sass \
         --part loop=80e0-8110 --part copies=8120-a410 --skip 8480-8d10 --skip 9ae0-a3b0 \
         --part qk=a420-ad80 --part qk=af40-b6e0 --part softmax=ad90-af30 \
         --part softmax=b6f0-be70 --part pv=be80-cb20 --part loop=f4a0-f4f0
     # kAuto, 4 heads, false
     python scripts/gpu/sass_tile_count.py --sass bf16_cc4.sass \
         --part loop=5440-5470 --part copies=5480-7160 --skip 5740-5f30 --skip 68b0-7100 \
         --part qk=7170-7320 --part qk=7660-7670 --part qkloop=7680-7ce0 --times qkloop=2 \
         --part qk=7cf0-7cf0 --part softmax=7d00-88e0 --part pv=88f0-8d90 --part pv=9170-9a10 \
         --part loop=9a20-9ac0
     # kAuto, 8 heads, false
     python scripts/gpu/sass_tile_count.py --sass bf16_cc8.sass \
         --part loop=5630-5660 --part copies=5670-76d0 --skip 5960-6170 --skip 6d70-7660 \
         --part qk=76e0-79d0 --part qk=7fd0-7fe0 --part qkloop=7ff0-8b50 --times qkloop=2 \
         --part qk=8b60-8b60 --part softmax=8b70-a290 --part pv=a2a0-a7c0 --part pv=abd0-bd00 \
         --part loop=bd10-bdf0
     # kFp8E4M3, 4 heads, false
     python scripts/gpu/sass_tile_count.py --sass fp8_cc4.sass \
         --part loop=5310-5340 --part copies=5350-70e0 --skip 55f0-5e50 --skip 67f0-7050 \
         --part qk=70f0-7340 --part qk=7a80-7a90 --part qkloop=7aa0-8880 --times qkloop=2 \
         --part qk=8890-8890 --part softmax=88a0-9560 --part pv=9570-95e0 \
         --part pvloop=95f0-9c40 --part pvloop=a1d0-aac0 --times pvloop=2 --part pv=aad0-aad0 \
         --part loop=aae0-ab80
     # the copies of a token-major cache on tensor cores (bf16, then fp8)
     python scripts/gpu/sass_tile_count.py --sass bf16_mma4.sass \
         --part copies=6040-7e50 --skip 62f0-6b10 --skip 70b0-76e0 --skip 7980-7df0
     python scripts/gpu/sass_tile_count.py --sass fp8_mma4.sass \
         --part copies=8120-a410 --skip 8480-8d10 --skip 9490-9ad0 --skip 9b00-a150
   Skipped: the blocksparse mask (its test counts), the element-by-element and the token-major V
   copies (and the second branch of the V-form test, which the vLLM copy's path jumps over),
   with an fp8 cache on tensor cores the token-major copy of the tile's QK / softmax / P.V (the
   ranges after the vLLM copy's closing branch); on CUDA cores the token-major side of P.V and
   the odd-count remainder of the QK loop (not reached at head 128). A 16-bit cache on tensor
   cores has one tile for both V forms: each P.V `ldmatrix` is issued in both forms, one
   predicated off, and both count.
   Every instruction in a part's address ranges (hex, inclusive; --part may repeat a name) counts
   once, except those in a --skip range; `--times NAME=N` multiplies a part (a loop that is not
   unrolled). A predicated instruction counts whether its predicate is true or not: it takes an
   issue slot either way.
   Both sides of a branch that some lanes take and others do not (divergence) are issued, so a
   part's range includes them; only code no lane of a full tile reaches goes in --skip.
   NOPs and never-executed `@!PT` placeholders (ptxas puts three `@!PT LDS RZ, [RZ]` before each
   LDGSTS) are shown apart, as they occupy issue slots without doing work.

Needs no GPU.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*")
BRANCH_TARGET = re.compile(r"(0x[0-9a-f]+)\s*$")
KERNEL_TU = """#include "cuda/attention_kernel_pipelined.cuh"
namespace paged_attn {{
namespace cuda {{
template __global__ void paged_attention_pipelined_kernel<{args}>(const PagedAttentionParams);
}}  // namespace cuda
}}  // namespace paged_attn
"""


def compile_to_sass(args, arch):
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/bin/nvcc"
    cuobjdump = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not cuobjdump:
        sys.exit("cuobjdump not found: put the CUDA toolkit's bin on PATH or set CUOBJDUMP")
    with tempfile.TemporaryDirectory() as work:
        src = os.path.join(work, "k.cu")
        cubin = os.path.join(work, "k.cubin")
        with open(src, "w") as f:
            f.write(KERNEL_TU.format(args=args))
        ptxas = subprocess.run(
            [nvcc, "-std=c++20", f"-arch={arch}", "-cubin", "-O3", "--expt-relaxed-constexpr",
             "-I", os.path.join(ROOT, "csrc"), "-Xptxas", "-v", "-o", cubin, src],
            check=True, capture_output=True, text=True)
        for line in ptxas.stderr.splitlines():
            if "registers" in line or "spill" in line:
                print("# ptxas:", line.strip().removeprefix("ptxas info    : "))
        return subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True,
                              text=True).stdout


def parse(sass_text):
    """[(address, instruction text)] of the first function in the listing."""
    out, functions = [], 0
    for line in sass_text.splitlines():
        if "Function :" in line:
            functions += 1
            if functions > 1:
                break
            continue
        m = LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(text):
    """(predicate or None, mnemonic without modifiers)."""
    pred = None
    if text.startswith("@"):
        pred, text = text.split(None, 1)
    return pred, text.split()[0].split(".")[0]


def kind(text):
    """'nop', 'placeholder' (never executed: @!PT) or 'work'."""
    pred, op = opcode(text)
    if op == "NOP":
        return "nop"
    if pred == "@!PT":
        return "placeholder"
    return "work"


def basic_blocks(ins):
    leaders = {ins[0][0]}
    for i, (addr, text) in enumerate(ins):
        _, op = opcode(text)
        if op in ("BRA", "BSSY", "CALL", "BREAK", "JMP"):
            m = BRANCH_TARGET.search(text)
            if m:
                leaders.add(int(m.group(1), 16))
        if op in ("BRA", "EXIT", "RET", "JMP") and i + 1 < len(ins):
            leaders.add(ins[i + 1][0])
    blocks = []
    for addr, text in ins:
        if addr in leaders or not blocks:
            blocks.append([])
        blocks[-1].append((addr, text))
    return blocks


def print_blocks(ins):
    for block in basic_blocks(ins):
        mix = collections.Counter(opcode(t)[1] for _, t in block if kind(t) == "work")
        extra = collections.Counter(kind(t) for _, t in block if kind(t) != "work")
        last = block[-1][1]
        branch = ""
        if opcode(last)[1] in ("BRA", "EXIT", "RET"):
            branch = last
            m = BRANCH_TARGET.search(last)
            if m and int(m.group(1), 16) <= block[0][0]:
                branch += "  <-- back edge"
        print(f"{block[0][0]:05x}-{block[-1][0]:05x} work={sum(mix.values()):4d} "
              + "".join(f"{k}={v} " for k, v in sorted(extra.items()))
              + f"| {branch}\n      " + " ".join(f"{k}:{v}" for k, v in mix.most_common()))


def hex_range(text):
    lo, hi = text.split("-")
    return int(lo, 16), int(hi, 16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--sass", help="a saved `cuobjdump -sass` listing (its first function)")
    src.add_argument("--kernel", help="template arguments of paged_attention_pipelined_kernel")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--save", help="write the SASS listing here")
    ap.add_argument("--blocks", action="store_true", help="list the basic blocks")
    ap.add_argument("--part", action="append", default=[], metavar="NAME=LO-HI")
    ap.add_argument("--skip", action="append", default=[], metavar="LO-HI")
    ap.add_argument("--times", action="append", default=[], metavar="NAME=N")
    a = ap.parse_args()

    text = open(a.sass).read() if a.sass else compile_to_sass(a.kernel, a.arch)
    if a.save:
        with open(a.save, "w") as f:
            f.write(text)
    ins = parse(text)
    if not ins:
        sys.exit("no SASS instructions found")
    if a.blocks:
        print_blocks(ins)
    if not a.part:
        return
    skips = [hex_range(s) for s in a.skip]
    times = {k: int(v) for k, v in (t.split("=") for t in a.times)}
    ranges = collections.defaultdict(list)  # a part may be given several ranges
    for spec in a.part:
        name, rng = spec.split("=")
        ranges[name].append(hex_range(rng))
    total = collections.Counter()
    print(f"{'part':12s} {'work':>6s} {'nop':>5s} {'@!PT':>5s}  mix (work)")
    for name, spans in ranges.items():
        n = times.get(name, 1)
        picked = [t for addr, t in ins
                  if any(lo <= addr <= hi for lo, hi in spans)
                  and not any(s <= addr <= e for s, e in skips)]
        counts = collections.Counter(kind(t) for t in picked)
        mix = collections.Counter(opcode(t)[1] for t in picked if kind(t) == "work")
        for k in counts:
            total[k] += n * counts[k]
        label = name if n == 1 else f"{name} x{n}"
        print(f"{label:12s} {n * counts['work']:6d} {n * counts['nop']:5d} "
              f"{n * counts['placeholder']:5d}  " + " ".join(f"{k}:{v}" for k, v in mix.most_common()))
    print(f"{'total':12s} {total['work']:6d} {total['nop']:5d} {total['placeholder']:5d}  "
          f"(all issued: {sum(total.values())})")


if __name__ == "__main__":
    main()
