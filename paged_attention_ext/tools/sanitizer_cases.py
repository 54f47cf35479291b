"""Every CUDA kernel path once, on small inputs, each result checked against the oracle: the
program scripts/gpu/device_check.sh runs under compute-sanitizer (memcheck, racecheck, synccheck).

    python -m paged_attention_ext.tools.sanitizer_cases [--kernels K,...] [--quick]
                                                        [--cases NAME,...] [--list]

The attention cases run once per CUDA attention kernel (--kernels; default: every kernel this
build has, the keys of _C.cuda_attention_launches()), each forced with PAGED_ATTN_CUDA_KERNEL;
the launch counters then prove that this kernel, and only this one, ran ("mma": its tensor-core
kernel, and the pipelined one for the shapes tensor cores do not take; testing.require_launches_of). The cache writes run
once (no kernel choice). Between them the cases reach: v2 phase 1 over several partitions and
its reduce kernel; v1 and decode both split (a few rows, tables far wider than the 256 tokens
below which csrc/core/split_plan.h never splits: phase 1 into scratch, then the reduce) and in one
pass (tables of at most 256 tokens); decode on NHD and HND caches; blocksparse; ALiBi; fp8 e4m3
and e5m2 caches; fp32, fp16 and bf16 queries; GQA ratios 1, 4, 8 and 16 (two passes of 8 heads);
block sizes 16 (vectorised V) and 5 (per-token V); empty rows; reshape_and_cache and
reshape_and_cache_flash (NHD and HND), bit for bit.

Inputs come from tools/testing.py (sharp softmax, shuffled block tables with garbage past each
row, NaN in every unused cache slot, NaN-prefilled outputs). The oracle (reference.py) runs on a
CPU copy of the inputs, once per case, so that the sanitizer sees our kernels and few others;
the comparisons are testing.assert_v2_matches / assert_out_matches (the tests' tolerances) and
conformance.cache_write (bytes). --quick: the cases marked quick (the vLLM layout with v2's
reduce and v1's split, blocksparse with two GQA passes, decode on a split HND cache), for the
slowest tool (racecheck).

Exit status: 0 when every case matched, 1 on any mismatch or error, 2 when nothing can run here
(no CUDA device, no compiled CUDA kernels) or the arguments are wrong.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import traceback
from typing import Optional

import torch

from .. import reference
from ..validation import Blocksparse
from . import backends, conformance, testing

EXIT_OK, EXIT_FAIL, EXIT_CANNOT_RUN = 0, 1, 2
DEVICE = "cuda"


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    """v2 and v1 on vLLM's cache layout (layout None), or decode on a token-major cache
    (layout: one of testing.DECODE_LAYOUTS)."""

    name: str
    covers: str  # the kernel paths it reaches
    shape: tuple  # (num_heads, num_kv_heads, head_size, block_size)
    seq_lens: tuple
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"
    alibi: bool = False
    layout: Optional[str] = None
    blocksparse: Blocksparse = testing.DENSE
    quick: bool = False


@dataclasses.dataclass(frozen=True)
class CacheWriteCase:
    """reshape_and_cache on vLLM's layout (layout None) or reshape_and_cache_flash on a
    token-major cache (layout: one of testing.DECODE_LAYOUTS)."""

    name: str
    covers: str
    shape: tuple  # (num_heads, num_kv_heads, head_size, block_size)
    dtype: torch.dtype
    kv_cache_dtype: str = "auto"
    layout: Optional[str] = None
    seq_lens: tuple = (40, 7)  # the rows already in the caches (the rest of them NaN)
    alibi: bool = False  # unused by a cache write; the input maker takes it
    quick: bool = False


ATTENTION_CASES = (
    AttentionCase("v2-v1-gqa8-alibi-bf16", "v2: 3 partitions + reduce; v1 split; GQA 8; ALiBi",
                  (16, 2, 128, 16), (1100, 1, 513), torch.bfloat16, alibi=True, quick=True),
    AttentionCase("v2-v1-mha-fp32-block5", "GQA 1; per-token V (block 5); fp32; v1 split",
                  (4, 4, 64, 5), (600, 37), torch.float32),
    AttentionCase("v2-v1-fp8e4m3-fp16-d256", "fp8 e4m3 cache; head size 256; GQA 8",
                  (8, 1, 256, 16), (700, 5), torch.float16, kv_cache_dtype="fp8_e4m3"),
    AttentionCase("v2-v1-one-pass-fp16", "v1 in one pass (table of 240 tokens); empty row",
                  (8, 2, 96, 16), (200, 0, 77), torch.float16),
    AttentionCase("blocksparse-gqa16-bf16", "blocksparse v2 + v1; GQA 16: two passes of 8",
                  (16, 1, 64, 16), (1100, 37, 523), torch.bfloat16,
                  blocksparse=Blocksparse(1, 2, 4, 32, 1), quick=True),
    AttentionCase("decode-nhd-split-fp32-alibi", "decode, NHD cache, split; fp32; ALiBi; GQA 4",
                  (8, 2, 128, 16), (700, 3), torch.float32, alibi=True, layout="nhd"),
    AttentionCase("decode-hnd-split-fp8e5m2-bf16", "decode, HND cache, split; fp8 e5m2; GQA 1",
                  (4, 4, 64, 16), (1030, 300), torch.bfloat16, kv_cache_dtype="fp8_e5m2",
                  layout="hnd", quick=True),
    AttentionCase("decode-nhd-one-pass-fp16", "decode, NHD cache, one pass; GQA 8; empty row",
                  (8, 1, 128, 16), (200, 1, 0), torch.float16, layout="nhd"),
)

CACHE_WRITE_CASES = (
    CacheWriteCase("reshape-and-cache-bf16", "reshape_and_cache, bf16 cache",
                   (4, 2, 64, 16), torch.bfloat16),
    CacheWriteCase("reshape-and-cache-fp8e4m3-fp32", "reshape_and_cache, fp32 -> fp8 e4m3",
                   (4, 2, 128, 16), torch.float32, kv_cache_dtype="fp8_e4m3"),
    CacheWriteCase("reshape-and-cache-flash-nhd-fp16", "reshape_and_cache_flash, NHD cache",
                   (4, 2, 64, 16), torch.float16, layout="nhd"),
    CacheWriteCase("reshape-and-cache-flash-hnd-fp8e5m2", "reshape_and_cache_flash, HND, fp8",
                   (4, 4, 64, 8), torch.bfloat16, kv_cache_dtype="fp8_e5m2", layout="hnd"),
)

CASES = ATTENTION_CASES + CACHE_WRITE_CASES
CASE_NAMES = tuple(case.name for case in CASES)


def kernel_names() -> tuple:
    """The CUDA attention kernels of this build (the extension's launch counters), () without
    a loaded extension or without CUDA kernels."""
    return tuple(testing.cuda_attention_launches())


# ---- inputs and the oracle ----

def _seed(case) -> int:
    """The case's seed: its place in CASES (the same inputs whichever cases a run selects)."""
    return CASE_NAMES.index(case.name)


def make_inputs(case, device=DEVICE):
    """testing.AttentionInputs (vLLM's layout) or testing.DecodeInputs of `case`."""
    heads, kv_heads, head_size, block_size = case.shape
    lens = list(case.seq_lens)
    common = dict(dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype, use_alibi=case.alibi,
                  device=device, seed=_seed(case))
    if case.layout is None:
        return testing.make_attention_inputs(len(lens), heads, kv_heads, head_size, block_size,
                                             lens, **common)
    return testing.make_decode_inputs(len(lens), heads, kv_heads, head_size, block_size, lens,
                                      layout=case.layout, **common)


def _on_cpu(inputs):
    """inputs with every tensor field copied to the CPU (the oracle's side)."""
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)}
    return dataclasses.replace(inputs, **{name: t.cpu() for name, t in tensors.items()
                                          if isinstance(t, torch.Tensor)})


def expected_outputs(case, inputs):
    """The oracle's outputs on a CPU copy of inputs: {"v2": V2Outputs, "v1": out} or
    {"decode": out}."""
    cpu = _on_cpu(inputs)
    if case.layout is not None:
        return {"decode": testing.call_decode(reference.decode, cpu, testing.alloc_v1_outputs(cpu))}
    return {"v2": testing.call_v2(reference.paged_attention_v2, cpu,
                                  testing.alloc_v2_outputs(cpu), case.blocksparse),
            "v1": testing.call_v1(reference.paged_attention_v1, cpu,
                                  testing.alloc_v1_outputs(cpu), case.blocksparse)}


# ---- the checks (AssertionError on a mismatch) ----

def check_attention(ops, case, inputs, expected):
    """ops' v2 (all four outputs) and v1, or decode, into NaN-prefilled outputs on the inputs'
    device, against the oracle's (expected_outputs)."""
    dtype, kv = inputs.dtype, inputs.kv_cache_dtype
    if case.layout is not None:
        out = testing.call_decode(ops.decode, inputs, testing.alloc_v1_outputs(inputs))
        testing.assert_out_matches(out.cpu(), expected["decode"], dtype, kv, name="decode out")
        return
    got = testing.call_v2(ops.v2, inputs, testing.alloc_v2_outputs(inputs), case.blocksparse)
    testing.assert_v2_matches(testing.V2Outputs(*(t.cpu() for t in got)), expected["v2"],
                              inputs.seq_lens_list, dtype, kv)
    out = testing.call_v1(ops.v1, inputs, testing.alloc_v1_outputs(inputs), case.blocksparse)
    testing.assert_out_matches(out.cpu(), expected["v1"], dtype, kv, name="v1 out")


def check_cache_write(ops, case, device=DEVICE):
    """ops' reshape_and_cache(_flash) of a few new tokens (one a padding slot) into NaN-poisoned
    caches, byte for byte against the oracle's (conformance.cache_write)."""
    inputs = make_inputs(case, device)
    key, value, slots = conformance.case_cache_write(inputs, _seed(case))
    op = "reshape_and_cache" if case.layout is None else "reshape_and_cache_flash"
    conformance.require(conformance.cache_write(ops, op, key, value, inputs.key_cache,
                                                inputs.value_cache, slots, case.kv_cache_dtype,
                                                inputs.k_scale, inputs.v_scale))


# ---- running ----

class Report:
    """One line per (case, kernel) on stdout, with its wall time (under a sanitizer: the
    figures to size device_check.sh's limits by); the failures remembered."""

    def __init__(self):
        self.failures = []

    def run(self, label, fn, *args):
        start = time.perf_counter()
        try:
            fn(*args)
            torch.cuda.synchronize()  # an asynchronous kernel error belongs to this case
        except Exception as exc:  # a mismatch, or an error the op or CUDA raised
            self.failures.append(label)
            print(f"FAIL {label}: {type(exc).__name__}: {exc}", flush=True)
            if not isinstance(exc, AssertionError):
                traceback.print_exc()
            return
        print(f"ok   {label} ({time.perf_counter() - start:.1f} s)", flush=True)


def run(cases, kernels) -> int:
    """Every attention case once per kernel, every cache write once; the exit status."""
    ops = backends.backend("cuda-kernel").ops
    report = Report()
    prepared = []
    for case in cases:
        if isinstance(case, AttentionCase):
            inputs = make_inputs(case)
            prepared.append((case, inputs, expected_outputs(case, inputs)))
    for kernel in kernels:
        with testing.cuda_kernel_setting(kernel):
            before = testing.cuda_attention_launches()
            for case, inputs, expected in prepared:
                report.run(f"{case.name} [{kernel}]", check_attention, ops, case, inputs, expected)
            after = testing.cuda_attention_launches()
        if prepared:
            report.run(f"launch counters [{kernel}]", testing.require_launches_of, kernel, before,
                       after, any(testing.on_tensor_cores(case.dtype, *case.shape[:2])
                           for case, _, _ in prepared))
    for case in cases:
        if isinstance(case, CacheWriteCase):
            report.run(case.name, check_cache_write, ops, case)
    torch.cuda.synchronize()
    total = len(prepared) * len(kernels) + sum(isinstance(c, CacheWriteCase) for c in cases)
    if report.failures:
        print(f"sanitizer_cases: {len(report.failures)} of {total} checks FAILED: "
              + ", ".join(report.failures), flush=True)
        return EXIT_FAIL
    print(f"sanitizer_cases: all {total} checks passed (kernels: {', '.join(kernels) or 'none'})",
          flush=True)
    return EXIT_OK


# ---- the command ----

def _names(text):
    return [name for name in text.split(",") if name]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m paged_attention_ext.tools.sanitizer_cases",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", default=None, metavar="K,...",
                        help="CUDA attention kernels to run the attention cases on (default: "
                             "every one this build has: " + (", ".join(kernel_names()) or
                                                             "none in this build") +
                             "; leave out one this GPU cannot run, e.g. pipelined below sm_80)")
    parser.add_argument("--quick", action="store_true",
                        help="only the cases marked quick (for racecheck)")
    parser.add_argument("--cases", default=None, metavar="NAME,...",
                        help="only these cases (--list names them)")
    parser.add_argument("--list", action="store_true",
                        help="print the cases and the kernels, run nothing (no GPU needed)")
    return parser


def select(args, parser):
    """(cases, kernels) the arguments ask for; parser.error (exit 2) on an unknown name."""
    cases = [c for c in CASES if c.quick] if args.quick else list(CASES)
    if args.cases is not None:
        unknown = sorted(set(_names(args.cases)) - set(CASE_NAMES))
        if unknown:
            parser.error(f"unknown case(s) {', '.join(unknown)}; the cases: "
                         + ", ".join(CASE_NAMES))
        cases = [c for c in cases if c.name in _names(args.cases)]
    available = kernel_names()
    kernels = list(available) if args.kernels is None else _names(args.kernels)
    unknown = sorted(set(kernels) - set(available))
    if unknown and available:
        parser.error(f"unknown kernel(s) {', '.join(unknown)}; this build has: "
                     + ", ".join(available))
    return cases, kernels


def _print_list(cases, kernels):
    print("kernels: " + (", ".join(kernels) or "none (this build of _C has no CUDA kernels)"))
    for case in cases:
        kind = "attention, per kernel" if isinstance(case, AttentionCase) else "cache write, once"
        print(f"{case.name:<38} {'quick' if case.quick else '     '} {kind:<22} {case.covers}")


def _why_nothing_runs(kernels) -> Optional[str]:
    """Why this machine cannot run the cases, or None."""
    if not torch.cuda.is_available():
        return (f"no CUDA device (torch.cuda.is_available() is False; torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}): the CUDA kernels cannot run here")
    try:
        backends.backend("cuda-kernel")
    except LookupError as exc:
        return f"our CUDA kernels are not active: {exc}"
    if not kernels:
        return "no CUDA attention kernel to run (--kernels is empty)"
    return None


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    cases, kernels = select(args, parser)
    if args.list:
        _print_list(cases, kernels)
        return EXIT_OK
    why = _why_nothing_runs(kernels)
    if why is not None:
        print(f"sanitizer_cases: {why}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    return run(cases, kernels)


if __name__ == "__main__":
    sys.exit(main())
