"""`check`: run every active backend's ops (v1, v2, reshape_and_cache on vLLM's layout; decode and
reshape_and_cache_flash on an NHD-ordered cache, NHD / HND / combined by turns) on a few fresh
random shapes against the oracle (paged_attention_ext.reference); report max errors, pass/fail.

Inputs come from paged_attention_ext.testing: N(0,1) q/k/v (sharp softmax), shuffled block
tables with garbage past each row, NaN in every unused cache slot, outputs pre-filled with NaN.
The shapes are drawn from a seed that is printed, so a failure can be replayed with --seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import torch

import paged_attention_ext

from . import reference, testing
from .backends import Backend, active_backends
from .core import KV_CACHE_DTYPES, cache_kind, key_chunk_elements
from .validation import QUERY_DTYPES


@dataclass
class CaseSpec:
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    seq_lens: list
    dtype: torch.dtype
    kv_cache_dtype: str
    use_alibi: bool

    @property
    def label(self) -> str:
        dtype = str(self.dtype).replace("torch.", "")
        return (f"seqs {self.num_seqs} heads {self.num_heads}/{self.num_kv_heads} "
                f"d{self.head_size} block {self.block_size} max_len {max(self.seq_lens)} "
                f"{dtype} kv {self.kv_cache_dtype}" + (" alibi" if self.use_alibi else ""))


@dataclass
class CaseResult:
    backend: str
    op: str
    case: str
    max_abs_err: float
    passed: bool
    message: str = ""


def head_sizes(build: Optional[dict]) -> tuple:
    """Head sizes every backend of this build takes with every cache dtype: the CUDA kernels'
    list (build_info, `build`) when CUDA kernels were compiled, else 32 to 256 (the CPU kernel and
    the fallback take any head size), keeping those whose fp8 row is whole 16-byte chunks
    (vLLM's x = core.key_chunk_elements of a byte cache; the CUDA kernels' vector loads)."""
    sizes = build["cuda_head_sizes"] if build and build["cuda"] else range(32, 257, 16)
    x = key_chunk_elements(torch.uint8)
    return tuple(d for d in sizes if d % x == 0)


def random_cases(rng: random.Random, count: int, sizes: tuple) -> list:
    """`count` shapes with head sizes drawn from `sizes`; the first is fp32 with a plain cache,
    one later one uses an fp8 cache, and lengths cross the 512-token partition boundary and
    include an empty row."""
    cases = []
    for i in range(count):
        kv_heads = rng.choice((1, 2, 4))
        group = rng.choice((1, 2, 3, 4))
        num_seqs = rng.randint(2, 5)
        lens = [rng.randint(1, 1300) for _ in range(num_seqs)]
        lens[rng.randrange(num_seqs)] = rng.choice((0, 511, 512, 513))
        dtype = torch.float32 if i == 0 else rng.choice(QUERY_DTYPES)
        kv = "auto" if i != 2 else rng.choice([s for s in KV_CACHE_DTYPES if s != "auto"])
        cases.append(CaseSpec(num_seqs, kv_heads * group, kv_heads, rng.choice(sizes),
                              rng.choice((8, 16, 32)), lens, dtype, kv, use_alibi=i == 1))
    return cases


def _inputs(case: CaseSpec, device: str, seed: int):
    return testing.make_attention_inputs(
        case.num_seqs, case.num_heads, case.num_kv_heads, case.head_size, case.block_size,
        case.seq_lens, dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype,
        use_alibi=case.use_alibi, device=device, seed=seed)


def _max_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.double() - expected.double().to(actual.device)).abs()
    return float(diff.nan_to_num(float("inf")).max()) if diff.numel() else 0.0


def _compare(fn, *args) -> tuple:
    try:
        fn(*args)
        return True, ""
    except AssertionError as exc:
        return False, str(exc).strip().splitlines()[0]


def _check_v1(backend: Backend, case: CaseSpec, seed: int) -> CaseResult:
    inputs = _inputs(case, backend.device, seed)
    actual = testing.call_v1(backend.ops.v1, inputs, testing.alloc_v1_outputs(inputs))
    expected = testing.call_v1(reference.paged_attention_v1, inputs,
                               testing.alloc_v1_outputs(inputs))
    ok, msg = _compare(testing.assert_out_matches, actual, expected, case.dtype,
                       case.kv_cache_dtype)
    return CaseResult(backend.name, "v1", case.label, _max_err(actual, expected), ok, msg)


def _check_v2(backend: Backend, case: CaseSpec, seed: int) -> CaseResult:
    inputs = _inputs(case, backend.device, seed)
    actual = testing.call_v2(backend.ops.v2, inputs, testing.alloc_v2_outputs(inputs))
    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs))
    ok, msg = _compare(testing.assert_v2_matches, actual, expected, case.seq_lens, case.dtype,
                       case.kv_cache_dtype)
    return CaseResult(backend.name, "v2", case.label, _max_err(actual.out, expected.out), ok, msg)


def _decode_inputs(case: CaseSpec, device: str, seed: int):
    layout = ("nhd", "hnd", "combined")[seed % 3]
    return testing.make_decode_inputs(
        case.num_seqs, case.num_heads, case.num_kv_heads, case.head_size, case.block_size,
        case.seq_lens, layout=layout, dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype,
        use_alibi=case.use_alibi, device=device, seed=seed)


def _check_decode(backend: Backend, case: CaseSpec, seed: int) -> CaseResult:
    inputs = _decode_inputs(case, backend.device, seed)
    actual = testing.call_decode(backend.ops.decode, inputs, testing.alloc_v1_outputs(inputs))
    expected = testing.call_decode(reference.decode, inputs, testing.alloc_v1_outputs(inputs))
    ok, msg = _compare(testing.assert_out_matches, actual, expected, case.dtype,
                       case.kv_cache_dtype)
    return CaseResult(backend.name, "decode", f"{case.label} {inputs.layout}",
                      _max_err(actual, expected), ok, msg)


def _check_cache(backend: Backend, case: CaseSpec, seed: int, flash: bool = False) -> CaseResult:
    """reshape_and_cache (flash: reshape_and_cache_flash into an NHD-ordered view) of a few new
    tokens (one padding slot -1) into a poisoned cache."""
    inputs = (_decode_inputs if flash else _inputs)(case, backend.device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    num_slots = inputs.num_blocks * inputs.block_size
    num_tokens = min(7, num_slots)
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[0] = -1
    shape = (num_tokens, case.num_kv_heads, case.head_size)
    key = torch.randn(shape, generator=gen).to(case.dtype).to(backend.device)
    value = torch.randn(shape, generator=gen).to(case.dtype).to(backend.device)
    slots = slots.to(backend.device)
    caches = {}
    op = "reshape_and_cache_flash" if flash else "reshape_and_cache"
    for name, fn in (("actual", getattr(backend.ops, op)), ("expected", getattr(reference, op))):
        k_cache, v_cache = inputs.key_cache.clone(), inputs.value_cache.clone()
        fn(key, value, k_cache, v_cache, slots, inputs.kv_cache_dtype, inputs.k_scale,
           inputs.v_scale)
        caches[name] = (k_cache, v_cache)
    # Bitwise comparison (NaN-poisoned slots must stay as they were): compare the bytes.
    same = all(torch.equal(a.view(torch.uint8), e.view(torch.uint8))
               for a, e in zip(caches["actual"], caches["expected"]))
    err = max(_max_err(decoded(a, inputs), decoded(e, inputs))
              for a, e in zip(caches["actual"], caches["expected"]))
    msg = "" if same else "cache bytes differ from the oracle's"
    label = f"{case.label} {inputs.layout}" if flash else case.label
    return CaseResult(backend.name, op, label, err, same, msg)


def decoded(cache: torch.Tensor, inputs) -> torch.Tensor:
    """Cache as float64 with NaN slots zeroed (for an error figure; the verdict is bitwise)."""
    kind = cache_kind(inputs.kv_cache_dtype, "check")
    if kind != "auto":
        cache = cache.view(testing.FP8_DTYPES[kind])
    return cache.double().nan_to_num(0.0)


CHECKS = (("v1", _check_v1), ("v2", _check_v2), ("reshape_and_cache", _check_cache),
          ("decode", _check_decode),
          ("reshape_and_cache_flash", lambda b, c, s: _check_cache(b, c, s, flash=True)))


def run_checks(num_cases: int = 3, seed: Optional[int] = None,
               backends: Optional[list] = None) -> tuple:
    """Returns (seed, backends, results)."""
    seed = random.SystemRandom().randrange(1 << 31) if seed is None else seed
    backends = active_backends() if backends is None else backends
    cases = random_cases(random.Random(seed), num_cases,
                         head_sizes(paged_attention_ext.build_info()))
    results = []
    for backend in backends:
        for i, case in enumerate(cases):
            for op, check in CHECKS:
                try:
                    results.append(check(backend, case, seed + i))
                except Exception as exc:  # an op that raises is a failure, not a crash
                    results.append(CaseResult(backend.name, op, case.label, float("nan"), False,
                                              f"{type(exc).__name__}: {exc}".splitlines()[0]))
    return seed, backends, results


def print_report(seed: int, backends: list, results: list, console=None) -> bool:
    """Prints the table; True when everything passed (and something ran)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"check: seed {seed} (replay with --seed {seed}); backends: "
                  + (", ".join(f"{b.name} [{b.device}] {b.detail}" for b in backends) or "none"),
                  highlight=False, markup=False)
    table = Table()
    for name in ("backend", "op", "case", "max abs err", "result"):
        table.add_column(name, overflow="fold")
    for r in results:
        table.add_row(r.backend, r.op, r.case, f"{r.max_abs_err:.2e}",
                      "pass" if r.passed else f"FAIL: {r.message}",
                      style=None if r.passed else "bold red")
    console.print(table)
    failed = [r for r in results if not r.passed]
    passed = bool(results) and not failed
    summary = (f"{len(results) - len(failed)}/{len(results)} passed" if results
               else "nothing ran: no active backend")
    console.print(("OK: " if passed else "FAILED: ") + summary, highlight=False, markup=False)
    return passed
