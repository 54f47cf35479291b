"""One backend's ops against the oracle (paged_attention_ext.reference): THE comparison that
`check` (selfcheck.py) and the tests share.

`ops` below is a backend's op namespace (tools.backends.Backend.ops: v1, v2, reshape_and_cache,
decode, reshape_and_cache_flash with torch.ops.paged_attn's argument lists); backends.backend(name)
gives the one a caller names. Each comparison runs the backend and the oracle on the same inputs
(tools/testing.py: sharp softmax, shuffled block tables with garbage past each row, NaN in every
unused cache slot, outputs pre-filled with NaN) and returns an Outcome per output it judged:
attention outputs within testing.tolerances (scratch only in the partitions a row has), cache
writes bit for bit (the NaN-poisoned slots must stay as they were). `require` turns a mismatch
into an AssertionError (the tests); `check` tabulates the outcomes.

random_cases draws the shapes `check` runs (CaseSpec), case_inputs / case_decode_inputs build
their inputs, case_cache_write the tokens a cache write stores.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .. import reference
from ..core import FP8_DTYPES, KV_CACHE_DTYPES, cache_kind, key_chunk_elements
from ..validation import QUERY_DTYPES
from . import testing


@dataclass
class Outcome:
    """One output of one op call judged against the oracle."""

    op: str             # what was compared: "v2", "v1", "decode vs v1", "reshape_and_cache"
    max_abs_err: float  # max |actual - expected| (inf where exactly one side is NaN)
    message: str = ""   # "" when it matches; else what differs (assert_close's report)
    actual: Any = None  # what the backend wrote: out, testing.V2Outputs or (key_cache, value_cache)

    @property
    def passed(self) -> bool:
        return not self.message


def require(*outcomes: Outcome) -> Outcome:
    """AssertionError naming every output that differs from the oracle; else the first outcome."""
    failed = [o for o in outcomes if not o.passed]
    if failed:
        raise AssertionError("\n".join(f"{o.op}: {o.message}" for o in failed))
    return outcomes[0]


def max_abs_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    diff = (actual.double() - expected.double().to(actual.device)).abs()
    return float(diff.nan_to_num(float("inf")).max()) if diff.numel() else 0.0


def _judge(op: str, actual, expected, assert_fn, *args) -> Outcome:
    """Outcome of assert_fn(actual, expected, *args); the error figure is over `out`."""
    out = getattr(actual, "out", actual)
    err = max_abs_err(out, getattr(expected, "out", expected))
    try:
        assert_fn(actual, expected, *args)
    except AssertionError as exc:
        return Outcome(op, err, str(exc).strip() or "mismatch", actual)
    return Outcome(op, err, "", actual)


def compare_out(op: str, actual, expected, dtype, kv_cache_dtype="auto") -> Outcome:
    """An attention output against the oracle's, within testing.tolerances (NaN fails)."""
    return _judge(op, actual, expected, testing.assert_out_matches, dtype, kv_cache_dtype)


# ---- attention: v1 / v2 on vLLM's cache layout, decode on NHD-ordered caches ----

def v2(ops, inputs, max_num_partitions=None, blocksparse=testing.DENSE) -> tuple:
    """(Outcome of ops.v2's four outputs, the oracle's V2Outputs)."""
    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs, max_num_partitions), blocksparse)
    actual = testing.call_v2(ops.v2, inputs, testing.alloc_v2_outputs(inputs, max_num_partitions),
                             blocksparse)
    return _judge("v2", actual, expected, testing.assert_v2_matches, inputs.seq_lens_list,
                  inputs.dtype, inputs.kv_cache_dtype), expected


def v1(ops, inputs, expected_out=None, blocksparse=testing.DENSE) -> Outcome:
    """ops.v1's out against the oracle's (expected_out: the oracle's v2 out when the caller has
    it; default: the oracle's v1 run here)."""
    if expected_out is None:
        expected_out = testing.call_v1(reference.paged_attention_v1, inputs,
                                       testing.alloc_v1_outputs(inputs), blocksparse)
    actual = testing.call_v1(ops.v1, inputs, testing.alloc_v1_outputs(inputs), blocksparse)
    return compare_out("v1", actual, expected_out, inputs.dtype, inputs.kv_cache_dtype)


def attention(ops, inputs, max_num_partitions=None, blocksparse=testing.DENSE) -> tuple:
    """(v2 outcome, v1 outcome): ops.v2 (all four outputs, scratch sized for
    max_num_partitions, default the longest row's) and ops.v1 against the oracle's v2."""
    v2_outcome, expected = v2(ops, inputs, max_num_partitions, blocksparse)
    return v2_outcome, v1(ops, inputs, expected.out, blocksparse)


def decode(ops, inputs, against_v1: bool = False) -> tuple:
    """(decode outcome,) or, against_v1, (decode outcome, decode vs v1 outcome): ops.decode on
    testing.DecodeInputs against reference.decode, and against ops.v1 on the same K/V in vLLM's
    layout (inputs.legacy: the contract's promise that both compute the same)."""
    expected = testing.call_decode(reference.decode, inputs, testing.alloc_v1_outputs(inputs))
    actual = testing.call_decode(ops.decode, inputs, testing.alloc_v1_outputs(inputs))
    outcomes = (compare_out("decode", actual, expected, inputs.dtype, inputs.kv_cache_dtype),)
    if against_v1:
        v1_out = testing.call_v1(ops.v1, inputs.legacy, testing.alloc_v1_outputs(inputs.legacy))
        outcomes += (compare_out("decode vs v1", actual, v1_out, inputs.dtype,
                                 inputs.kv_cache_dtype),)
    return outcomes


# ---- every fp8 byte: a backend's own fp8 decode, all 256 bytes of a format ----

EVERY_BYTE_LAYOUTS = ("vllm", "nhd", "hnd")  # v1 on vLLM's layout; decode on NHD and HND
# (kv_cache_dtype, side, layout): every combination, what the tests of each backend run
EVERY_BYTE_CASES = tuple((kind, side, layout) for kind in FP8_DTYPES
                         for side in testing.EVERY_BYTE_SIDES for layout in EVERY_BYTE_LAYOUTS)


def every_fp8_byte(ops, kv_cache_dtype: str, side: str, layout: str = "vllm",
                   device: str = "cpu") -> Outcome:
    """ops.v1 ("vllm") or ops.decode (a token-major layout) on testing.every_fp8_byte_inputs,
    against the out those inputs define (not against another implementation): through V,
    exactly (NaN and inf where the byte is one); through K, within fp32's tolerance."""
    inputs, want = testing.every_fp8_byte_inputs(kv_cache_dtype, side, layout, device)
    op = "v1" if layout == "vllm" else "decode"
    call = testing.call_v1 if layout == "vllm" else testing.call_decode
    actual = call(getattr(ops, op), inputs, testing.alloc_v1_outputs(inputs))
    name = f"{op} every {kv_cache_dtype} byte as {side}"

    def exactly(got, expected):
        got = got.double().cpu()
        assert torch.equal(got.isnan(), expected.isnan()), "NaN where the byte is not NaN or back"
        bad = (got.nan_to_num() != expected.nan_to_num()).nonzero()
        assert len(bad) == 0, (f"{len(bad)} outputs differ, first [seq, head, dim] "
                               f"{bad[0].tolist()}: {got[tuple(bad[0])]}, want "
                               f"{expected[tuple(bad[0])]}")

    if side == "key":
        return compare_out(name, actual, want, inputs.dtype, kv_cache_dtype)
    outcome = _judge(name, actual, want, exactly)
    finite = want.isfinite()  # the error figure over the finite bytes (NaN - NaN is no error)
    same_nan = torch.equal(actual.isnan().cpu(), want.isnan())
    outcome.max_abs_err = max_abs_err(actual.cpu()[finite], want[finite]) if same_nan else math.inf
    return outcome


# ---- cache writes: reshape_and_cache, reshape_and_cache_flash ----

def decoded(cache: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """Cache as float64 with NaN slots zeroed (for an error figure; the verdict is bitwise)."""
    kind = cache_kind(kv_cache_dtype, "conformance")  # "fp8" -> "fp8_e4m3"
    if kind != "auto":
        cache = cache.view(testing.FP8_DTYPES[kind])
    return cache.double().nan_to_num(0.0)


def same_layout_copy(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` with its strides and storage offset, in a copy of its whole storage: a view
    into a bigger tensor (combined K/V, padded strides) stays such a view, where clone() would
    make it contiguous."""
    storage = t.untyped_storage().clone()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, t.storage_offset(),
                                                                t.shape, t.stride())


def cache_write(ops, op: str, key, value, key_cache, value_cache, slot_mapping,
                kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0) -> Outcome:
    """ops.<op> (reshape_and_cache or reshape_and_cache_flash) and the oracle's, each into its
    own same-layout copy of key_cache / value_cache (left as they are): the bytes must be equal,
    NaN-poisoned slots included. actual: the backend's (key_cache, value_cache)."""
    caches = {}
    for name, fn in (("actual", getattr(ops, op)), ("expected", getattr(reference, op))):
        k_cache, v_cache = same_layout_copy(key_cache), same_layout_copy(value_cache)
        fn(key, value, k_cache, v_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)
        caches[name] = (k_cache, v_cache)
    differ = [name for name, a, e in zip(("key_cache", "value_cache"), caches["actual"],
                                         caches["expected"])
              if not torch.equal(a.view(torch.uint8), e.view(torch.uint8).to(a.device))]
    err = max(max_abs_err(decoded(a, kv_cache_dtype), decoded(e, kv_cache_dtype))
              for a, e in zip(caches["actual"], caches["expected"]))
    message = (f"{' and '.join(differ)} bytes differ from the oracle's" if differ else "")
    return Outcome(op, err, message, caches["actual"])


# ---- the random cases `check` runs ----

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


def head_sizes(build: Optional[dict]) -> tuple:
    """Head sizes every backend of this build takes with every cache dtype: the CUDA kernels'
    list (build_info, `build`) when CUDA kernels were compiled, else 32 to 256 (the CPU kernel and
    the fallback take any head size), keeping those whose fp8 row is whole 16-byte vectors
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
        kv = "auto" if i != 2 else rng.choice([s for s, kind in KV_CACHE_DTYPES.items()
                                                if kind != "auto"])
        cases.append(CaseSpec(num_seqs, kv_heads * group, kv_heads, rng.choice(sizes),
                              rng.choice((8, 16, 32)), lens, dtype, kv, use_alibi=i == 1))
    return cases


def case_inputs(case: CaseSpec, device: str, seed: int):
    """testing.AttentionInputs of `case` (vLLM's cache layout)."""
    return testing.make_attention_inputs(
        case.num_seqs, case.num_heads, case.num_kv_heads, case.head_size, case.block_size,
        case.seq_lens, dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype,
        use_alibi=case.use_alibi, device=device, seed=seed)


def case_decode_inputs(case: CaseSpec, device: str, seed: int):
    """testing.DecodeInputs of `case`, the caches laid out NHD, HND or combined by turns."""
    layout = ("nhd", "hnd", "combined")[seed % 3]
    return testing.make_decode_inputs(
        case.num_seqs, case.num_heads, case.num_kv_heads, case.head_size, case.block_size,
        case.seq_lens, layout=layout, dtype=case.dtype, kv_cache_dtype=case.kv_cache_dtype,
        use_alibi=case.use_alibi, device=device, seed=seed)


def case_cache_write(inputs, seed: int) -> tuple:
    """(key, value, slot_mapping): a few new tokens of `inputs`' shape for a cache write, one of
    them a padding slot (-1), the others distinct slots of inputs' caches."""
    gen = torch.Generator().manual_seed(seed + 1)
    device = inputs.query.device
    num_slots = inputs.num_blocks * inputs.block_size
    num_tokens = min(7, num_slots)
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[0] = -1
    shape = (num_tokens, inputs.num_kv_heads, inputs.head_size)
    key = torch.randn(shape, generator=gen).to(inputs.dtype).to(device)
    value = torch.randn(shape, generator=gen).to(inputs.dtype).to(device)
    return key, value, slots.to(device)
