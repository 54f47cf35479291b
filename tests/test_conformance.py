"""Every backend of this build against the oracle (paged_attention_ext.reference), each case
written once: v1 / v2 on vLLM's cache layout (blocksparse included), decode on token-major
caches, reshape_and_cache(_flash) bit for bit, and round trips through a cache write.

The `backend` fixture (conftest.py, tests/support/backend_params.py) runs each test on every
compiled CPU kernel variant this CPU executes (forced, and checked to be the one that runs), the
PyTorch fallback (under each of its chunkings where the test is marked so), and each CUDA
attention kernel when a GPU is present (its launch counters proving it ran); a backend this
machine cannot run is skipped with the reason. Cache-write tests run the CPU's one cache writer
rather than each attention variant.

Inputs come from paged_attention_ext.tools.testing: N(0,1) q/k/v with a sharp softmax, shuffled
block tables with garbage past each row, NaN in every cache slot no sequence uses, fp8 scales
!= 1, outputs pre-filled with NaN. v2 is compared on all four outputs (scratch only in the
partitions a row has), v1 on `out`; decode against reference.decode and against v1 on the same
K/V in vLLM's layout (testing.DECODE_LAYOUTS: NHD, HND as a transposed view, K and V of a combined
tensor, mixed, padded strides). What only one backend has (ISA choice, the fallback's plan and
sync-freedom, CUDA graphs and splits) is tested in tests/test_cpu_kernel.py,
tests/test_fallback.py and tests/test_cuda_kernels.py.
"""

from typing import NamedTuple

import pytest
import torch

from paged_attention_ext import reference
from paged_attention_ext.tools import conformance, testing
from paged_attention_ext.validation import PARTITION_SIZE, Blocksparse
from support import cache_writes
from support.backend_params import CUDA_HEAD_SIZES, on_device
from support.blocksparse import CASES as BLOCKSPARSE_CASES
from support.blocksparse import inputs as blocksparse_inputs
from support.blocksparse import mask as blocksparse_mask
from support.blocksparse import poison_skipped


class Case(NamedTuple):
    dtype: torch.dtype
    kv: str  # kv_cache_dtype
    heads: int
    kv_heads: int
    head_size: int
    block_size: int
    seq_lens: list
    alibi: bool
    seed: int
    noncontig_query: bool = False  # a slice of a fused qkv tensor, NaN elsewhere
    scale_as_tensor: bool = False  # k_scale / v_scale as 0-dim tensors

    @property
    def id(self):
        return (f"{str(self.dtype)[6:]}-{self.kv}-h{self.heads}/{self.kv_heads}-d{self.head_size}"
                f"-bs{self.block_size}-n{len(self.seq_lens)}{'-alibi' if self.alibi else ''}"
                f"{'-strided_q' if self.noncontig_query else ''}"
                f"{'-tensor_scale' if self.scale_as_tensor else ''}")

    def inputs(self, device, **kw):
        return testing.make_attention_inputs(
            len(self.seq_lens), self.heads, self.kv_heads, self.head_size, self.block_size,
            self.seq_lens, dtype=self.dtype, kv_cache_dtype=self.kv, use_alibi=self.alibi,
            device=device, seed=self.seed, noncontig_query=self.noncontig_query,
            scale_as_tensor=self.scale_as_tensor, **kw)

    def decode_inputs(self, device, layout):
        return testing.make_decode_inputs(
            len(self.seq_lens), self.heads, self.kv_heads, self.head_size, self.block_size,
            self.seq_lens, layout=layout, dtype=self.dtype, kv_cache_dtype=self.kv,
            use_alibi=self.alibi, device=device, seed=self.seed,
            noncontig_query=self.noncontig_query, scale_as_tensor=self.scale_as_tensor)


def params_of(cases):
    return [pytest.param(c, id=c.id) for c in cases]


def check_v1_v2(backend, inputs, max_num_partitions=None, blocksparse=testing.DENSE):
    """v2 (all four outputs) and v1 of `backend` against the oracle's v2."""
    backend.require_takes(inputs)
    return conformance.require(*conformance.attention(backend.ops, inputs, max_num_partitions,
                                                      blocksparse)).actual


def check_decode(backend, inputs, against_v1=True):
    """decode against reference.decode and (against_v1) against the backend's v1 on the same
    K/V in vLLM's layout."""
    backend.require_takes(inputs)
    return conformance.require(*conformance.decode(backend.ops, inputs, against_v1)).actual


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
DTYPES = (F32, F16, BF16)

# ---- v1 / v2 ----

# 1 token, partition edges 511/512/513, 1537 (4 partitions, 1 token in the last), empty, odd.
EDGE_LENS = [1, 511, 512, 513, 1537, 0, 37]
# Every dtype and fp8 format; MHA, GQA 4/6/8 and MQA; head sizes 24 and 40 (odd multiples of
# x = 4 and 8), 48, 80; block sizes 1, 5 (not dividing 512), 8, 16, 32; ALiBi on and off.
ORACLE_CASES = [
    Case(F32, "auto", 8, 2, 128, 16, [1, 511, 512, 513, 0, 1537], False, 134),  # GQA 4
    Case(BF16, "auto", 12, 2, 256, 16, [700, 33], True, 258),  # GQA 6, ALiBi
    Case(F16, "auto", 8, 8, 80, 5, [511, 1030], False, 82),  # MHA, odd block size
    Case(F32, "auto", 8, 1, 64, 8, [300, 1025], True, 66),  # MQA (GQA 8)
    Case(F32, "auto", 6, 2, 24, 32, [77, 600], False, 26),  # head 24 (odd multiple of x=4)
    Case(BF16, "auto", 4, 1, 40, 16, [513, 5], False, 42),  # head 40 (odd multiple of x=8)
    Case(F32, "fp8", 8, 2, 64, 16, [300, 1025], True, 66),  # fp8 e4m3, x = 16
    Case(BF16, "fp8_e4m3", 6, 1, 128, 8, [1, 600], False, 130),
    Case(F16, "fp8_e5m2", 4, 2, 48, 32, [77, 513], False, 50),  # head 48 = 3 * 16
    Case(F32, "auto", 4, 2, 32, 1, [5, 513], False, 34),  # block size 1
] + [  # every row length of EDGE_LENS; a strided query and tensor scales by turns
    Case(dtype, kv, h, kvh, d, bs, EDGE_LENS, alibi, i, i % 2 == 0, i % 3 == 0)
    for i, (dtype, kv, (h, kvh, d, bs), alibi) in enumerate([
        (F32, "auto", (4, 4, 64, 16), False), (F32, "auto", (8, 1, 64, 5), True),
        (F16, "auto", (8, 2, 64, 8), True), (BF16, "auto", (12, 2, 128, 32), False),
        (BF16, "auto", (16, 2, 80, 16), True), (F32, "fp8_e4m3", (16, 2, 64, 16), False),
        (BF16, "fp8", (6, 1, 64, 32), True), (F16, "fp8_e5m2", (8, 2, 64, 5), False),
        (BF16, "fp8_e5m2", (12, 2, 64, 8), True)])]


@pytest.mark.backends(chunkings=True)
@pytest.mark.parametrize("case", params_of(ORACLE_CASES))
def test_matches_oracle(backend, case):
    check_v1_v2(backend, case.inputs(backend.device))


# Short rows: items (512-token partitions) of 1 .. 5 tokens, whole short rows and a short last
# partition behind a full one, crossing blocks with block sizes 1, 3 and 5 (the CPU kernel works
# per token on items of at most 4 tokens: csrc/cpu/kernel_common.h kShortTokens); and rows that
# fit one partition, with an empty one (the CPU kernel writes an fp32 `out` itself then).
SHORT_LENS = ([1, 2, 3, 4, 5, 513, 514, 516, 517], [3, 1, 0, 4, 5, 300])
SHORT_CASES = [Case(dtype, kv, h, kvh, d, bs, lens, alibi, d + bs + len(lens))
               for dtype, kv, (h, kvh, d, bs), alibi in [
                   (F32, "auto", (8, 2, 128, 16), False), (BF16, "auto", (12, 2, 80, 3), True),
                   (F16, "auto", (4, 4, 64, 1), False), (BF16, "fp8_e4m3", (6, 1, 96, 8), True),
                   (F32, "fp8_e5m2", (4, 2, 48, 5), False)]
               for lens in SHORT_LENS]


@pytest.mark.parametrize("case", params_of(SHORT_CASES))
def test_short_rows_match_oracle(backend, case):
    check_v1_v2(backend, case.inputs(backend.device))
    if len(case.seq_lens) == len(SHORT_LENS[0]):
        for layout in ("nhd", "hnd"):
            check_decode(backend, case.decode_inputs(backend.device, layout))


ODD_LENS = [0, 1, 511, 512, 513, 1537, 77]
# (num_seqs, heads, kv_heads, head_size, block_size, seq_lens, alibi): the CUDA kernels' head
# tiles and passes, the per-token V path, and every head size the CUDA kernels are compiled for
# (none in a build without them).
GRID = [
    (8, 8, 128, 16, ODD_LENS, False),       # MHA, every odd length
    (32, 8, 128, 16, ODD_LENS, True),       # Llama-3 GQA 4, ALiBi
    (12, 4, 64, 8, [513, 1, 1537], False),  # GQA 3 (head tile 4, one slot idle)
    (24, 2, 64, 32, [700, 0, 33], True),    # GQA 12: two passes of 8 heads
    (16, 1, 128, 16, [1025, 9], False),     # MQA 16
    (4, 2, 96, 12, [97, 300], False),       # block size 12: per-token V path for 2-byte types
    (2, 1, 80, 1, [5, 40], True),           # block size 1
] + [(4, 2, d, 16, [54, 513, 1], False) for d in CUDA_HEAD_SIZES]
GRID_CASES = [Case(dtype, "auto", h, kvh, d, bs, lens, alibi, hash((len(lens), h, d, bs)) % 1000)
              for dtype in DTYPES for h, kvh, d, bs, lens, alibi in GRID]


@pytest.mark.parametrize("case", params_of(GRID_CASES))
def test_head_tiles_and_head_sizes_match_oracle(backend, case):
    check_v1_v2(backend, case.inputs(backend.device))


# bf16 shapes for the CPU kernel's matrix tiles (the amx variant: csrc/cpu/amx_*.h; G 1 runs
# avx512's code there): head tiles of every size and more than one (G 3 .. 20), head sizes with a
# tail of the 32-dim chunks (80, 112, 40), two K chunks and two PV passes (256), blocks of 1 .. 8
# 16-token groups, partitions that start and end inside a chunk; on vLLM's layout (v1 / v2) and
# token-major (decode).
TILE_GRID = [
    (8, 8, 128, 16, [1, 17, 600], False),    # G 1 (not on tiles)
    (12, 4, 64, 32, [513, 5, 1100], True),   # G 3
    (32, 8, 128, 64, [77, 1537], False),     # G 4, bs 64
    (10, 2, 80, 16, [700, 33], False),       # G 5, a 16-dim tail
    (12, 2, 256, 32, [1100, 3], True),       # G 6, two K chunks, two PV passes
    (16, 2, 96, 128, [600, 129], False),     # G 8, bs 128
    (24, 2, 112, 16, [513, 40], False),      # G 12, a 16-dim tail
    (16, 2, 64, 16, [700, 31], False),       # G 8, blocks of 16
    (8, 2, 256, 16, [530, 17], True),        # G 4, blocks of 16, two PV passes
    (20, 1, 160, 32, [300, 1025], True),     # G 20, several head tiles everywhere
    (6, 2, 40, 16, [520, 9], False),         # G 3, head 40 (token-major tiles only)
]
TILE_CASES = [Case(BF16, "auto", h, kvh, d, bs, lens, alibi, 7 * d + bs)
              for h, kvh, d, bs, lens, alibi in TILE_GRID]


@pytest.mark.parametrize("case", params_of(TILE_CASES))
def test_matrix_tile_shapes_match_oracle(backend, case):
    check_v1_v2(backend, case.inputs(backend.device))
    for layout in ("nhd", "hnd"):
        check_decode(backend, case.decode_inputs(backend.device, layout))


FP8_GRID = [
    (32, 8, 128, 16, [1, 512, 513, 1537, 100], False),
    (8, 8, 64, 8, [511, 0, 64], True),
    (6, 2, 256, 32, [1100, 3], False),
    (4, 4, 112, 16, [600, 17], False),
]
FP8_CASES = [Case(dtype, kv, h, kvh, d, bs, lens, alibi, 3, scale_as_tensor=tensor)
             for h, kvh, d, bs, lens, alibi in FP8_GRID for kv in ("fp8", "fp8_e4m3", "fp8_e5m2")
             for dtype in DTYPES for tensor in (False, True)]


# every shape with every fp8 kind, query dtype and scale form: broad, so slow off a GPU (the CPU
# backends' fp8 reads are in the default run through ORACLE_CASES, DECODE_CASES and every byte)
@pytest.mark.backends(slow_off_gpu=True)
@pytest.mark.parametrize("case", params_of(FP8_CASES))
def test_fp8_caches_match_oracle(backend, case):
    check_v1_v2(backend, case.inputs(backend.device))


# The cases of tests/test_blocksparse_reference.py (block sizes 5, 8 and 16: the per-token and the
# vectorised V paths; sparse blocks smaller than, equal to, multiples and non-multiples of the
# cache block; per-query-head and per-KV-head patterns; fp8), plus a GQA ratio of 12 (two passes
# of 8 heads on CUDA, each reading only the blocks its own heads attend).
ALL_BLOCKSPARSE_CASES = BLOCKSPARSE_CASES + [
    ("gqa12-two-passes", (24, 2, 64, 16), Blocksparse(1, 1, 16, 32, 1), F16, "auto", True),
]


def check_blocksparse(backend, inputs, sparse):
    """v2 and v1 against the oracle on inputs whose (cache block, KV head) pairs no query head
    of the KV head attends are NaN: a backend that reads one, or lets it into the softmax,
    gives NaN."""
    poisoned = on_device(poison_skipped(inputs, blocksparse_mask(inputs, sparse)), backend.device)
    return check_v1_v2(backend, poisoned, blocksparse=sparse)


@pytest.mark.parametrize("case", ALL_BLOCKSPARSE_CASES, ids=[c[0] for c in ALL_BLOCKSPARSE_CASES])
def test_blocksparse_matches_oracle(backend, case):
    check_blocksparse(backend, blocksparse_inputs(case, seed=21), case[2])


def test_blocksparse_nothing_attended_gives_zeros_and_empty_partitions(backend):
    # Sparse block 0 is skipped by every head (vertical only, offset 1, vert 2): rows of 1 and
    # 100 tokens attend nothing (zeros), the 1100-token row has empty partitions (max_logits
    # -inf, exp_sums 0, tmp_out 0) next to full ones.
    case = ("empty", (4, 2, 32, 8), Blocksparse(0, 0, 2, 600, 0), F32, "auto", False)
    got = check_blocksparse(backend, blocksparse_inputs(case, seed=7, seq_lens=[1, 100, 1100]),
                            case[2])
    assert torch.equal(got.out[:2], torch.zeros_like(got.out[:2]))
    assert (got.max_logits[2, :, 0] == float("-inf")).all() and (got.exp_sums[2, :, 0] == 0).all()
    assert (got.tmp_out[2, :, 0] == 0).all() and got.out[2].abs().sum() > 0


@pytest.mark.parametrize("layout", testing.CACHE_LAYOUTS)
def test_caches_with_outer_strides_of_a_bigger_tensor(backend, layout):
    # Caches whose (block, head) strides are not those of a contiguous tensor (vLLM may hand out
    # views of a bigger allocation): honoured, and the NaN around them never read.
    for case in (Case(BF16, "auto", 8, 2, 64, 16, [1, 600, 1025], False, 13),
                 Case(F32, "fp8_e4m3", 8, 2, 64, 16, [1, 600, 1025], False, 13),
                 Case(BF16, "auto", 12, 2, 128, 32, EDGE_LENS, False, 13),
                 Case(F32, "fp8_e4m3", 16, 2, 64, 16, EDGE_LENS, False, 13)):
        inputs = testing.with_strided_caches(case.inputs(backend.device), layout)
        assert inputs.key_cache.stride(0) != inputs.key_cache.shape[1] * inputs.key_cache.stride(1)
        check_v1_v2(backend, inputs)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_scale_overloads_and_fused_query(backend, scale_as_tensor):
    """k_scale / v_scale as floats and as tensors (the .scale_tensor overload); the query a slice
    of a fused qkv tensor (NaN elsewhere); scratch with more partitions than needed."""
    inputs = Case(F32, "fp8_e5m2", 8, 2, 64, 16, [100, 1100, 3], False, 7, True,
                  scale_as_tensor).inputs(backend.device)
    assert inputs.query.stride(0) > inputs.num_heads * inputs.head_size
    check_v1_v2(backend, inputs, max_num_partitions=5)


@pytest.mark.parametrize("case", params_of([
    Case(F32, "auto", 8, 2, 64, 16, [700, 3, 1025], True, 11),
    Case(F16, "auto", 16, 4, 128, 16, [1537, 2, 600, 1024], False, 11, noncontig_query=True)]))
def test_scratch_larger_than_needed(backend, case):
    # tmp_out covers more tokens than the block table holds: the extra partitions are skipped.
    check_v1_v2(backend, case.inputs(backend.device), max_num_partitions=7)


def test_max_seq_len_is_only_a_hint(backend):
    inputs = Case(F32, "auto", 8, 2, 64, 16, [1500, 700], False, 0).inputs(backend.device)
    inputs.max_seq_len = 1  # a wrong hint must not drop tokens
    check_v1_v2(backend, inputs)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_auto_caches_ignore_the_kv_scales(backend, scale_as_tensor):
    """kv_cache_dtype "auto": k_scale / v_scale are not applied (only fp8 values are decoded
    byte * scale; the oracle ignores them), whatever their form, in v1 / v2 and in decode."""
    def scales():
        if scale_as_tensor:
            return (torch.tensor(0.37, device=backend.device),
                    torch.tensor(1.9, device=backend.device))
        return 0.37, 1.9

    inputs = Case(BF16, "auto", 8, 2, 64, 16, [100, 600, 7], True, 23).inputs(backend.device)
    inputs.k_scale, inputs.v_scale = scales()
    check_v1_v2(backend, inputs)
    for alibi in (False, True):
        dec = Case(F32, "auto", 8, 2, 64, 16, [100, 600], alibi, 24).decode_inputs(
            backend.device, "hnd")
        dec.k_scale, dec.v_scale = scales()
        check_decode(backend, dec, against_v1=False)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("which", ["key", "value"])
def test_fp8_nan_byte_in_an_attended_slot_reaches_the_output(backend, kv, which):
    """value = decoded byte * scale (CONTRACT.md), the NaN byte (0x7F) included: a NaN in an
    attended slot reaches exactly the outputs it reaches in the oracle (a K NaN: every dim of the
    query heads of its KV head; a V NaN: that one dim of them). A vector decode mapping the NaN
    byte to a finite value (e4m3's 0x7F is 480 by its exponent bits) would also make every read
    of the NaN-poisoned unused slots of fp8 caches invisible to the other tests."""
    inp = Case(F32, kv, 8, 2, 64, 16, [40, 21], False, 21).inputs(backend.device)
    block = int(inp.block_tables[0, 1])  # row 0's second block: tokens 16..31, all attended
    if which == "key":  # [num_blocks, kv_heads, head_size / 16, block_size, 16]: token 19, dim 37
        inp.key_cache[block, 1, 2, 3, 5] = testing.FP8_NAN_BYTE
    else:  # [num_blocks, kv_heads, head_size, block_size]: token 19, dim 7
        inp.value_cache[block, 1, 7, 3] = testing.FP8_NAN_BYTE
    want = testing.call_v1(reference.paged_attention_v1, inp, testing.alloc_v1_outputs(inp))
    # The oracle: NaN only in row 0's query heads 4..7 (KV head 1 of a GQA group of 4).
    assert want[0, 4:].isnan().any() and not want[0, :4].isnan().any()
    assert not want[1].isnan().any()
    got_v1 = testing.call_v1(backend.ops.v1, inp, testing.alloc_v1_outputs(inp))
    got_v2 = testing.call_v2(backend.ops.v2, inp, testing.alloc_v2_outputs(inp)).out
    atol, rtol = testing.tolerances(inp.dtype, kv)
    for name, got in (("v1", got_v1), ("v2", got_v2)):
        assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaN pattern differs"
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)


@pytest.mark.parametrize("kv,side,layout", conformance.EVERY_BYTE_CASES,
                         ids=["-".join(c) for c in conformance.EVERY_BYTE_CASES])
def test_every_fp8_byte_decodes_right(backend, kv, side, layout):
    """All 256 bytes of the format through V (out is each decoded byte: compared exactly, NaN and
    inf included) or through K (a logit of +-1 per byte: compared at fp32's tolerance), in
    vLLM's layout (v1) and token-major (decode); testing.every_fp8_byte_inputs says how. The
    random caches of the other tests hold a few octaves of bytes around the scale: a vector
    decode turning +-448 into NaN passed every one of them."""
    conformance.require(conformance.every_fp8_byte(backend.ops, kv, side, layout,
                                                   backend.device))


@pytest.mark.parametrize("case", params_of([
    Case(F32, "auto", 4, 2, 32, 16, [0, 0], False, 3),
    Case(BF16, "fp8_e4m3", 4, 2, 32, 16, [0, 0], True, 5),
    Case(BF16, "fp8_e4m3", 4, 2, 32, 16, [PARTITION_SIZE * 2], True, 5)]))
def test_edge_batches(backend, case):
    # All rows empty: zeros, never NaN. One row of exactly two partitions.
    inputs = case.inputs(backend.device)
    got = check_v1_v2(backend, inputs)
    if max(case.seq_lens) == 0:
        out = testing.call_v1(backend.ops.v1, inputs, testing.alloc_v1_outputs(inputs))
        assert torch.equal(out, torch.zeros_like(out))
        assert torch.equal(got.out, torch.zeros_like(got.out))


@pytest.mark.backends(slow_off_gpu=True)
@pytest.mark.parametrize("case", params_of([
    Case(F32, "auto", 8, 2, 128, 16, [5000, 4097], True, 11),
    Case(BF16, "auto", 8, 2, 128, 16, [5000, 4097], True, 11),
    Case(BF16, "auto", 32, 8, 128, 16, [100_000], False, 9)]))
def test_long_rows_many_partitions(backend, case):
    # (the 100k-token row: one unused block, not three, in a pool of 6250)
    check_v1_v2(backend, case.inputs(backend.device, extra_blocks=1 if case.seq_lens[0] > 5000
                                     else 3))


def append_one_token(backend, inputs, write):
    """One new bf16 token per sequence written by `write` (reshape_and_cache or its flash form)
    at slot seq_len of the row's table; the lengths grow by one."""
    g = torch.Generator().manual_seed(1)
    new_k = torch.randn(2, 2, 64, generator=g).to(BF16).to(backend.device)
    new_v = torch.randn(2, 2, 64, generator=g).to(BF16).to(backend.device)
    tables = inputs.block_tables.cpu()
    slots = [int(tables[s, n // 16]) * 16 + n % 16 for s, n in enumerate(inputs.seq_lens_list)]
    write(new_k, new_v, inputs.key_cache, inputs.value_cache,
          torch.tensor(slots, device=backend.device))
    inputs.seq_lens += 1
    inputs.seq_lens_list = [n + 1 for n in inputs.seq_lens_list]


def test_cache_then_attend_round_trip(backend):
    """Tokens written with reshape_and_cache, then read back by v1: the same output as the oracle
    on the same cache (end to end through the cache layout)."""
    inp = Case(BF16, "auto", 8, 2, 64, 16, [40, 90], False, 9).inputs(backend.device)
    append_one_token(backend, inp, backend.ops.reshape_and_cache)
    inp.max_seq_len += 1
    check_v1_v2(backend, inp)


# ---- decode: token-major caches (core/kv_layout.h) ----

DECODE_CASES = [
    Case(F32, "auto", 8, 2, 128, 16, [1, 511, 0, 513, 1537], False, 133),  # GQA 4, 4 partitions
    Case(BF16, "auto", 12, 2, 256, 16, [700, 33], True, 258),  # GQA 6, ALiBi
    Case(F16, "auto", 8, 8, 80, 5, [511, 1030], False, 82),  # MHA, odd block size, 80 = 5 x 16
    Case(F32, "auto", 8, 1, 64, 1, [300, 0, 77], True, 67),  # MQA, block size 1
    Case(F32, "auto", 6, 2, 20, 32, [77, 600], False, 22),  # head 20: a 4-dim tail row
    Case(BF16, "auto", 4, 1, 40, 7, [513, 5], False, 42),  # head 40: an 8-dim tail, bs 7
    Case(F32, "fp8", 8, 2, 64, 16, [300, 1025], True, 66),  # fp8 e4m3
    Case(BF16, "fp8_e4m3", 6, 1, 128, 8, [1, 600], False, 130),
    Case(F16, "fp8_e5m2", 4, 2, 48, 3, [77, 513], False, 50),  # odd block size
    Case(BF16, "fp8_e5m2", 8, 2, 112, 16, [1100, 2], True, 114),
    # bf16 on avx512-bf16's dot-product QK / PV, every register tile: one head a tile with a
    # 32-dim chunk past head 96, two heads with head 160 (5 chunks), three with a 8-dim last chunk
    Case(BF16, "auto", 8, 8, 96, 5, [511, 1030, 2], False, 99),
    Case(BF16, "auto", 4, 2, 160, 16, [1537, 19], False, 162),
    Case(BF16, "auto", 6, 2, 72, 3, [77, 600, 1], True, 75),
    Case(F16, "auto", 24, 2, 64, 16, [700, 3], False, 66),  # GQA 12: two passes on CUDA
    Case(F16, "fp8_e5m2", 4, 2, 96, 3, [77, 513], False, 98),  # odd block size, CUDA's head size
]
# Every case on NHD and HND, and one more layout each by turns, over the first 13 and over the
# nine below (the second list's turns skip "padded", whose views are 16-byte aligned only for
# 4-byte elements, as the CUDA kernels need: it has the fp32 plain-cache cases instead).
_SECOND = [DECODE_CASES[i] for i in (0, 1, 2, 3, 13, 6, 7, 14, 9)]
DECODE_PARAMS = list({f"{c.id}-{lay}": (c, lay) for c, lay in (
    [(c, lay) for i, c in enumerate(DECODE_CASES[:13])
     for lay in ("nhd", "hnd", testing.DECODE_LAYOUTS[2 + i % 4])]
    + [(c, lay) for i, c in enumerate(_SECOND)
       for lay in ("nhd", "hnd", ("combined", "combined_hnd", "mixed")[i % 3])]
    + [(c, "padded") for c in _SECOND if c.dtype == F32 and c.kv == "auto"])}.values())


@pytest.mark.parametrize("case,layout", [pytest.param(c, lay, id=f"{c.id}-{lay}")
                                         for c, lay in DECODE_PARAMS])
def test_decode_matches_oracle(backend, case, layout):
    inputs = case.decode_inputs(backend.device, layout)
    if layout == "mixed":
        assert inputs.key_cache.stride() != inputs.value_cache.stride()  # K and V strides differ
    check_decode(backend, inputs)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_decode_scale_overloads_and_fused_query(backend, scale_as_tensor):
    inputs = Case(F32, "fp8_e5m2", 8, 2, 64, 16, [100, 1100, 3], False, 7, True,
                  scale_as_tensor).decode_inputs(backend.device, "combined_hnd")
    assert inputs.query.stride(0) > inputs.num_heads * inputs.head_size
    check_decode(backend, inputs)


def test_decode_all_rows_empty(backend):
    inputs = Case(F32, "auto", 4, 2, 32, 16, [0, 0], False, 3).decode_inputs(backend.device, "hnd")
    out = check_decode(backend, inputs)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.backends(slow_off_gpu=True)
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_decode_long_rows(backend, layout):
    check_decode(backend, Case(BF16, "auto", 8, 2, 128, 16, [5000, 4097], True, 11)
                 .decode_inputs(backend.device, layout))


# ---- cache writes: bit for bit against the oracle's ----

@pytest.mark.backends(cpu_variants=False)
@pytest.mark.parametrize("dtype,kv", cache_writes.DTYPE_KV,
                         ids=map(cache_writes.dtype_kv_id, cache_writes.DTYPE_KV))
@pytest.mark.parametrize("scale_as_tensor", [False, True], ids=["float-scale", "tensor-scale"])
@pytest.mark.parametrize("source", cache_writes.SOURCES)
def test_reshape_and_cache_bit_exact(backend, dtype, kv, scale_as_tensor, source):
    args = cache_writes.reshape_and_cache_case(source, dtype, kv, scale_as_tensor, backend.device)
    written = conformance.require(conformance.cache_write(backend.ops, "reshape_and_cache", *args))
    if source == "poisoned-all":  # every slot padding: the caches as they were
        for got, before in zip(written.actual, args[2:4]):
            assert torch.equal(got.view(torch.uint8), before.view(torch.uint8))


@pytest.mark.backends(cpu_variants=False)
@pytest.mark.parametrize("dtype,kv", cache_writes.DTYPE_KV_FEW,
                         ids=map(cache_writes.dtype_kv_id, cache_writes.DTYPE_KV_FEW))
@pytest.mark.parametrize("layout", testing.DECODE_LAYOUTS)
@pytest.mark.parametrize("slot_kind", cache_writes.SLOTS)
def test_reshape_and_cache_flash_bit_exact(backend, dtype, kv, layout, slot_kind):
    """Negative slots skipped, rows past slot_mapping never read, fp8 saturated; floats then
    tensors as scales, the second write on top of the first."""
    key, value, kc, vc, slots = cache_writes.flash_case(slot_kind, layout, dtype, kv,
                                                        backend.device)
    for k_scale, v_scale in cache_writes.flash_scales(backend.device):
        written = conformance.cache_write(backend.ops, "reshape_and_cache_flash", key, value, kc,
                                          vc, slots, kv, k_scale, v_scale)
        kc, vc = conformance.require(written).actual  # the next write goes on top


def test_flash_cache_then_decode_round_trip(backend):
    """Tokens appended with reshape_and_cache_flash into an HND cache (a view), then read back by
    decode: the oracle's output on the same cache."""
    inputs = Case(BF16, "auto", 8, 2, 64, 16, [40, 90], False, 9).decode_inputs(backend.device,
                                                                                 "hnd")
    append_one_token(backend, inputs, backend.ops.reshape_and_cache_flash)
    check_decode(backend, inputs, against_v1=False)
