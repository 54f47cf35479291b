"""The CUDA kernels (csrc/cuda) against the oracle (paged_attention_ext.reference).

test_cuda_kernels_registered needs only the dispatcher: it runs in every CUDA build, GPU or not, and
fails unless every op overload has a compiled CUDA kernel (so a broken CUDA build cannot hide behind
the PyTorch fallback that serves CUDA tensors when no kernel is compiled); where a GPU is present it
fails for a build without CUDA too. The other tests run kernels: only where torch sees a CUDA device
(skipped otherwise, with the reason).

Inputs come from paged_attention_ext.tools.testing: N(0,1) q/k/v (sharp softmax), shuffled block tables
with garbage past each row, NaN-poisoned unused cache slots, fp8 caches with scales != 1, outputs
pre-filled with NaN. All four v2 outputs are compared (scratch only where the contract defines it).
Blocksparse cases poison every skipped (cache block, KV head) with NaN. decode runs on the
token-major layouts of testing.DECODE_LAYOUTS against reference.decode and against v1 on the same
K/V in vLLM's layout; reshape_and_cache(_flash) are compared bit for bit.
"""

import dataclasses
import math

import pytest
import torch

from support import fatbin
import paged_attention_ext
from conftest import registered_ops
from paged_attention_ext import reference, schemas
from paged_attention_ext.core import key_chunk_elements
from paged_attention_ext.tools import backends, conformance, testing
from paged_attention_ext.tools.testing import (alloc_v1_outputs, alloc_v2_outputs,
                                               assert_out_matches, assert_v2_matches, call_v1,
                                               call_v2, make_attention_inputs,
                                               with_strided_caches)
from paged_attention_ext.validation import Blocksparse
from support.blocksparse import CASES as BLOCKSPARSE_CASES
from support.blocksparse import inputs as blocksparse_inputs
from support.blocksparse import mask as blocksparse_mask
from support.blocksparse import poison_skipped

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.cuda

DEV = "cuda"
# The head sizes the CUDA kernels are compiled for (csrc/cuda/dispatch.cuh, via build_info()); none
# without a CUDA build, where the tests using them skip.
HEAD_SIZES = tuple((paged_attention_ext.build_info() or {}).get("cuda_head_sizes", ()))
ODD_LENS = [0, 1, 511, 512, 513, 1537, 77]


@pytest.fixture
def ops():
    if not CUDA:
        pytest.skip("no CUDA device (torch.cuda.is_available() is False): the CUDA kernels "
                    "cannot run here (test_cuda_kernels_registered checks that they are registered)")
    registered_ops()
    if not backends.compiled_kernel("v2", "CUDA"):
        pytest.skip("no compiled CUDA kernel: test_cuda_kernels_registered fails for this build")
    # by name: active only when every op has a compiled CUDA kernel that runs on this GPU
    return backends.backend("cuda-kernel").ops


# The CUDA attention kernels (csrc/cuda/kernel_choice.h): the oracle comparisons, graph and
# robustness tests run once per kernel, each forced with PAGED_ATTN_CUDA_KERNEL. "mma" runs the
# pipelined kernel with the GQA group on tensor cores for 16-bit queries with GQA >= 3
# (testing.on_tensor_cores) and the plain pipelined kernel for other shapes.
KERNELS = ("baseline", "pipelined", "mma")
KERNEL_ENV = testing.CUDA_KERNEL_ENV
_kernel_setting = testing.cuda_kernel_setting  # PAGED_ATTN_CUDA_KERNEL=value, read again


@pytest.fixture(params=KERNELS)
def kernel_ops(request, ops):
    """`ops` with PAGED_ATTN_CUDA_KERNEL set to the parameter for the test, and afterwards the
    proof that this kernel, and only this one, ran: the extension's launch counters
    (_C.cuda_attention_launches). A test cannot pass on another kernel. "mma" may also count
    pipelined launches (the shapes tensor cores do not take; test_mma_choice_follows_the_rule
    checks which shapes those are)."""
    name = request.param
    if name != "baseline" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip(f"the {name} kernel needs sm_80+ (cp.async, mma.sync); this GPU is sm_"
                    + "".join(map(str, torch.cuda.get_device_capability())))
    if (name == "baseline" and torch.cuda.get_device_capability() >= (8, 0)
            and paged_attention_ext.build_info()["cuda_baseline_kernel"] != "every arch"):
        pytest.skip("this build has no baseline kernel for sm_80+ (built without "
                    "PAGED_ATTN_CUDA_BASELINE=1, as CI and scripts/gpu/device_check.sh build it)")
    with _kernel_setting(name):
        before = testing.cuda_attention_launches()
        yield ops
        after = testing.cuda_attention_launches()
    testing.require_launches_of(name, before, after)


def test_build_info_names_the_cuda_attention_kernel():
    build = paged_attention_ext.build_info() or {}
    if not build.get("cuda"):
        pytest.skip("no CUDA build: build_info()['cuda_attention_kernel'] is ''")
    for value, start in (("", "auto: mma where the code"), ("baseline", "baseline ("),
                         ("pipelined", "pipelined ("), ("mma", "mma ("), ("turbo", "error: ")):
        with _kernel_setting(value):
            got = paged_attention_ext.build_info()["cuda_attention_kernel"]
        assert got.startswith(start), (value, got)
        assert value != "turbo" or "'turbo'" in got


def test_unknown_kernel_setting_is_a_clear_error(ops):
    inputs = make_attention_inputs(1, 4, 2, 64, 16, [30], dtype=torch.float16, device=DEV)
    with pytest.raises(RuntimeError, match=r"PAGED_ATTN_CUDA_KERNEL='turbo' is not"):
        with _kernel_setting("turbo"):
            call_v1(ops.v1, inputs, alloc_v1_outputs(inputs))


def _launches_of_one_call(ops, setting, inputs):
    """{kernel: launches} of one v1 call under PAGED_ATTN_CUDA_KERNEL=setting."""
    with _kernel_setting(setting):
        before = paged_attention_ext._C.cuda_attention_launches()
        call_v1(ops.v1, inputs, alloc_v1_outputs(inputs))
        after = paged_attention_ext._C.cuda_attention_launches()
    return {k: after[k] - before[k] for k in KERNELS}


def test_default_kernel_follows_the_rule(ops):
    """Unset: mma on sm_80+ (tensor cores for a 16-bit GQA-4 call), baseline below
    (kernel_choice.h; device_check.sh builds for the GPU's own arch, so the code's arch is the
    GPU's here)."""
    inputs = make_attention_inputs(1, 8, 2, 64, 16, [30], dtype=torch.float16, device=DEV)
    want = "mma" if torch.cuda.get_device_capability() >= (8, 0) else "baseline"
    assert _launches_of_one_call(ops, "", inputs) == {k: int(k == want) for k in KERNELS}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (4, 2), (6, 2), (8, 2), (16, 2)])
def test_mma_choice_follows_the_rule(ops, dtype, num_heads, num_kv_heads):
    """PAGED_ATTN_CUDA_KERNEL=mma: tensor cores exactly where testing.on_tensor_cores says, the
    pipelined kernel elsewhere."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the mma kernel needs sm_80+")
    dtype = getattr(torch, dtype)
    inputs = make_attention_inputs(2, num_heads, num_kv_heads, 128, 16, [40, 600], dtype=dtype,
                                   device=DEV)
    want = "mma" if testing.on_tensor_cores(dtype, num_heads, num_kv_heads) else "pipelined"
    assert _launches_of_one_call(ops, "mma", inputs) == {k: int(k == want) for k in KERNELS}


def _cuda_archs_in_extension():
    return fatbin.library_archs(paged_attention_ext._C.__file__)


def test_cuda_kernels_registered():
    registered_ops()
    if not CUDA:  # no GPU: only a CUDA build of _C has CUDA kernels to check
        if not paged_attention_ext.extension_loaded():
            pytest.skip("no CUDA build to check (extension _C: "
                        f"{paged_attention_ext.extension_status()})")
        if not _cuda_archs_in_extension():
            pytest.skip(f"CPU-only build: {paged_attention_ext._C.__file__} holds no CUDA code "
                        f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})")
    names = [name for name, _ in schemas.SCHEMAS]
    missing = [name for name in names if not backends.compiled_kernel(name, "CUDA")]
    assert not missing, (
        f"no compiled CUDA kernel for {', '.join(missing)} (extension _C: "
        f"{paged_attention_ext.extension_status()}); build with CUDA: "
        "PAGED_ATTN_BUILD_CUDA=1 python setup.py build_ext --inplace")


def _reference_v2(inputs, max_num_partitions=None):
    expected = alloc_v2_outputs(inputs, max_num_partitions)
    return call_v2(reference.paged_attention_v2, inputs, expected)


def _check_v2(ops, inputs, max_num_partitions=None):
    return conformance.require(conformance.v2(ops, inputs, max_num_partitions)[0]).actual


def _check_v1(ops, inputs):
    return conformance.require(conformance.v1(ops, inputs)).actual


# (num_seqs, num_heads, num_kv_heads, head_size, block_size, seq_lens, alibi)
GRID = [
    (7, 8, 8, 128, 16, ODD_LENS, False),       # MHA, every odd length
    (7, 32, 8, 128, 16, ODD_LENS, True),       # Llama-3 GQA 4, ALiBi
    (3, 12, 4, 64, 8, [513, 1, 1537], False),  # GQA 3 (head tile 4, one slot idle)
    (3, 24, 2, 64, 32, [700, 0, 33], True),    # GQA 12: two passes of 8 heads
    (2, 16, 1, 128, 16, [1025, 9], False),     # MQA 16
    (2, 4, 2, 96, 12, [97, 300], False),       # block size 12: per-token V path for 2-byte types
    (2, 2, 1, 80, 1, [5, 40], True),           # block size 1
] + [(3, 4, 2, d, 16, [54, 513, 1], False) for d in HEAD_SIZES]  # every head size once

DTYPES = ["float32", "float16", "bfloat16"]


def _ids(case):
    s, h, kvh, d, bs, lens, alibi = case
    return f"s{s}-h{h}-kv{kvh}-d{d}-bs{bs}{'-alibi' if alibi else ''}"


@pytest.mark.parametrize("case", GRID, ids=_ids)
@pytest.mark.parametrize("dtype", DTYPES)
def test_v2_and_v1_match_reference(kernel_ops, case, dtype):
    s, h, kvh, d, bs, lens, alibi = case
    dtype = getattr(torch, dtype)
    inputs = make_attention_inputs(s, h, kvh, d, bs, lens, dtype=dtype, use_alibi=alibi,
                                   device=DEV, seed=hash((s, h, d, bs)) % 1000)
    _check_v2(kernel_ops, inputs)
    _check_v1(kernel_ops, inputs)


FP8_GRID = [
    (5, 32, 8, 128, 16, [1, 512, 513, 1537, 100], False),
    (3, 8, 8, 64, 8, [511, 0, 64], True),
    (2, 6, 2, 256, 32, [1100, 3], False),
    (2, 4, 4, 112, 16, [600, 17], False),
]


@pytest.mark.parametrize("case", FP8_GRID, ids=_ids)
@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_as_tensor", [False, True], ids=["float-scale", "tensor-scale"])
def test_fp8_cache_matches_reference(kernel_ops, case, kv_cache_dtype, dtype, scale_as_tensor):
    s, h, kvh, d, bs, lens, alibi = case
    inputs = make_attention_inputs(s, h, kvh, d, bs, lens, dtype=getattr(torch, dtype),
                                   kv_cache_dtype=kv_cache_dtype, use_alibi=alibi, device=DEV,
                                   scale_as_tensor=scale_as_tensor, seed=3)
    _check_v2(kernel_ops, inputs)
    _check_v1(kernel_ops, inputs)


@pytest.mark.parametrize("kv,side,layout", conformance.EVERY_BYTE_CASES,
                         ids=["-".join(c) for c in conformance.EVERY_BYTE_CASES])
def test_every_fp8_byte_decodes_right(kernel_ops, kv, side, layout):
    """All 256 bytes of each fp8 format through V (exactly) and K (testing.every_fp8_byte_inputs)
    on the GPU; the random fp8 caches above hold a few octaves of bytes around the scale."""
    conformance.require(conformance.every_fp8_byte(kernel_ops, kv, side, layout, "cuda"))


def test_strided_query_and_larger_scratch(kernel_ops):
    # query a slice of a fused qkv tensor (NaN elsewhere); scratch with spare partitions
    inputs = make_attention_inputs(4, 16, 4, 128, 16, [1537, 2, 600, 1024], dtype=torch.float16,
                                   device=DEV, noncontig_query=True, seed=11)
    assert inputs.query.stride(0) > 16 * 128
    _check_v2(kernel_ops, inputs, max_num_partitions=7)
    _check_v1(kernel_ops, inputs)


@pytest.mark.parametrize("layout", ["blocks_interleaved", "head_padding"])  # testing.CACHE_LAYOUTS
def test_caches_with_outer_strides_of_a_bigger_tensor(kernel_ops, layout):
    # (block, head) strides of a view into a bigger NaN-filled allocation: honoured, never read.
    for dtype, kv in ((torch.bfloat16, "auto"), (torch.float32, "fp8_e4m3")):
        inputs = make_attention_inputs(3, 8, 2, 64, 16, [1, 600, 1025], dtype=dtype,
                                       kv_cache_dtype=kv, device=DEV, seed=13)
        inputs = with_strided_caches(inputs, layout)
        _check_v2(kernel_ops, inputs)
        _check_v1(kernel_ops, inputs)


def test_max_seq_len_is_only_a_hint(kernel_ops):
    inputs = make_attention_inputs(2, 8, 2, 64, 16, [1500, 700], dtype=torch.float32, device=DEV)
    inputs.max_seq_len = 1  # a wrong hint must not drop tokens
    _check_v2(kernel_ops, inputs)
    _check_v1(kernel_ops, inputs)


def test_unsupported_head_size(ops):
    inputs = make_attention_inputs(1, 2, 1, 48, 16, [10], dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match="Unsupported head size: 48"):
        call_v1(ops.v1, inputs, alloc_v1_outputs(inputs))


# ---- blocksparse (CONTRACT.md "Blocksparse") ----

def _to_device(inputs):
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)
               if isinstance(getattr(inputs, f.name), torch.Tensor)}
    return dataclasses.replace(inputs, **{name: t.to(DEV) for name, t in tensors.items()})


def _check_blocksparse(ops, inputs, sparse):
    """v2 (all four outputs) and v1 against the oracle's v2, on inputs whose (cache block, KV
    head) pairs that no query head of the KV head attends are NaN: a kernel that reads one of
    them, or lets it into the softmax, gives NaN."""
    poisoned = _to_device(poison_skipped(inputs, blocksparse_mask(inputs, sparse)))
    return conformance.require(*conformance.attention(ops, poisoned, blocksparse=sparse)).actual


# The cases of tests/test_blocksparse_reference.py (block sizes 5, 8 and 16: the per-token and the
# vectorised V paths; sparse blocks smaller than, equal to, multiples and non-multiples of the
# cache block; per-query-head and per-KV-head patterns; fp8), plus a GQA ratio of 12 (two passes of
# 8 heads, each pass reading only the blocks its own heads attend).
CUDA_BLOCKSPARSE_CASES = BLOCKSPARSE_CASES + [
    ("gqa12-two-passes", (24, 2, 64, 16), Blocksparse(1, 1, 16, 32, 1),
     torch.float16, "auto", True),
]


@pytest.mark.parametrize("case", CUDA_BLOCKSPARSE_CASES, ids=[c[0] for c in CUDA_BLOCKSPARSE_CASES])
def test_blocksparse_matches_reference(kernel_ops, case):
    _check_blocksparse(kernel_ops, blocksparse_inputs(case, seed=31), case[2])


def test_blocksparse_nothing_attended_gives_zeros_and_empty_partitions(kernel_ops):
    # Sparse block 0 is skipped by every head (vertical only, offset 1, vert 2): rows of 1 and
    # 100 tokens attend nothing (zeros), the 1100-token row has empty partitions (max_logits
    # -inf, exp_sums 0, tmp_out 0) next to full ones.
    case = ("empty", (4, 2, 32, 8), Blocksparse(0, 0, 2, 600, 0), torch.float32, "auto", False)
    got = _check_blocksparse(kernel_ops, blocksparse_inputs(case, seed=7, seq_lens=[1, 100, 1100]),
                             case[2])
    assert torch.equal(got.out[:2], torch.zeros_like(got.out[:2]))
    assert (got.max_logits[2, :, 0] == float("-inf")).all() and (got.exp_sums[2, :, 0] == 0).all()
    assert (got.tmp_out[2, :, 0] == 0).all() and got.out[2].abs().sum() > 0


# ---- mixed devices: the contract's ValueError (validation runs before the device guard) ----

def test_mixed_devices_raise_value_error(ops):
    inputs = make_attention_inputs(2, 4, 2, 64, 16, [20, 3], dtype=torch.float16, device=DEV)
    on_cpu = dataclasses.replace(inputs, query=inputs.query.cpu())
    with pytest.raises(ValueError, match=r"^paged_attn\.v1: .*device"):
        call_v1(ops.v1, on_cpu, alloc_v1_outputs(inputs))
    key = torch.randn(3, 2, 64, dtype=torch.float16)  # on the CPU, the caches on the GPU
    slots = torch.tensor([0, -1, 17], dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match=r"^paged_attn\.reshape_and_cache: .*device"):
        ops.reshape_and_cache(key, key, inputs.key_cache, inputs.value_cache, slots)


# ---- data-dependent validity: NaN rows, never an out-of-bounds read ----

def _nan_rows(out):
    return out.isnan().flatten(1).all(dim=1).tolist()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_bad_data_gives_nan_rows(kernel_ops, version):
    lens = [40, 40, 40, 40, 40]
    inputs = make_attention_inputs(5, 8, 2, 64, 16, lens, dtype=torch.float16, device=DEV, seed=5)
    bt = inputs.block_tables
    bt[1, 1] = inputs.num_blocks + 1000  # used block id past the pool
    bt[2, 0] = -7                        # negative used block id
    seq_lens = inputs.seq_lens
    seq_lens[3] = -1                                     # negative length
    seq_lens[4] = bt.shape[1] * inputs.block_size + 1    # beyond the table's capacity
    if version == "v1":
        out = call_v1(kernel_ops.v1, inputs, alloc_v1_outputs(inputs, fill=0.0))
    else:
        out = call_v2(kernel_ops.v2, inputs, alloc_v2_outputs(inputs, fill=0.0)).out
    torch.cuda.synchronize()
    assert _nan_rows(out) == [False, True, True, True, True]
    # the good row is still right
    good = make_attention_inputs(5, 8, 2, 64, 16, lens, dtype=torch.float16, device=DEV, seed=5)
    expected = call_v1(reference.paged_attention_v1, good, alloc_v1_outputs(good))
    assert_out_matches(out[:1], expected[:1], torch.float16)


@pytest.mark.parametrize("op", ["v1", "decode"])
def test_row_near_int32_max_gives_nan_row(kernel_ops, op):
    """A row longer than the kernels' int32 token positions allow (csrc/cuda/row_check.cuh
    kMaxRowTokens = 2^31 - 2049), held by a block table that repeats block 0 (2^23 entries of
    256-token blocks), is a bad row: NaN, nothing read; the short row beside it is right."""
    block_size = 256
    dec = testing.make_decode_inputs(2, 4, 2, 64, block_size, [40, 40], layout="nhd",
                                     dtype=torch.float16, device=DEV, seed=34)
    width = (2**31 - 1 + block_size - 1) // block_size
    table = torch.zeros(2, width, dtype=torch.int32, device=DEV)
    table[:, :dec.block_tables.shape[1]] = dec.block_tables
    dec = dataclasses.replace(dec, block_tables=table,
                              legacy=dataclasses.replace(dec.legacy, block_tables=table))
    dec.seq_lens[1] = 2**31 - 1 - 1000  # within 2048 of INT32_MAX, inside the table's capacity
    if op == "v1":
        out = call_v1(kernel_ops.v1, dec.legacy, alloc_v1_outputs(dec.legacy, fill=0.0))
    else:
        out = testing.call_decode(kernel_ops.decode, dec, alloc_v1_outputs(dec, fill=0.0))
    torch.cuda.synchronize()
    assert _nan_rows(out) == [False, True]
    good = testing.make_decode_inputs(2, 4, 2, 64, block_size, [40, 40], layout="nhd",
                                      dtype=torch.float16, device=DEV, seed=34)
    expected = call_v1(reference.paged_attention_v1, good.legacy, alloc_v1_outputs(good.legacy))
    assert_out_matches(out[:1], expected[:1], torch.float16)


def test_v2_scratch_too_small_gives_nan_row(kernel_ops):
    inputs = make_attention_inputs(2, 4, 4, 64, 16, [1100, 300], dtype=torch.float32, device=DEV)
    outputs = call_v2(kernel_ops.v2, inputs,
                      alloc_v2_outputs(inputs, max_num_partitions=2, fill=0.0))
    torch.cuda.synchronize()
    assert _nan_rows(outputs.out) == [True, False]  # 1100 tokens need 3 partitions


# ---- reshape_and_cache ----

@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale_as_tensor", [False, True], ids=["float-scale", "tensor-scale"])
def test_reshape_and_cache_matches_reference(ops, kv_cache_dtype, dtype, scale_as_tensor):
    dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(7)
    num_tokens, kvh, d, bs, num_blocks = 37, 4, 80, 16, 9
    fp8 = kv_cache_dtype != "auto"
    cache_dtype = torch.uint8 if fp8 else dtype
    x = key_chunk_elements(cache_dtype)
    key = (torch.randn(num_tokens, kvh, d, generator=gen) * 100).to(dtype).to(DEV)  # some saturate
    value = torch.randn(num_tokens, kvh, d, generator=gen).to(dtype).to(DEV)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:num_tokens]
    slots[::5] = -1  # padding tokens
    slot_mapping = slots.to(torch.int64).to(DEV)
    k_cache = torch.zeros(num_blocks, kvh, d // x, bs, x, dtype=cache_dtype, device=DEV)
    v_cache = torch.zeros(num_blocks, kvh, d, bs, dtype=cache_dtype, device=DEV)
    k_scale, v_scale = (0.37, 1.9) if fp8 else (1.0, 1.0)
    if scale_as_tensor:
        k_scale = torch.tensor(k_scale, device=DEV)
        v_scale = torch.tensor(v_scale, device=DEV)
    # bit-exact: same conversion, same rounding
    conformance.require(conformance.cache_write(ops, "reshape_and_cache", key, value, k_cache,
                                                v_cache, slot_mapping, kv_cache_dtype, k_scale,
                                                v_scale))


# ---- torch integration ----

def test_opcheck_on_cuda(ops):
    inputs = make_attention_inputs(2, 4, 2, 64, 16, [600, 3], dtype=torch.float16, device=DEV)
    args = testing._attention_args(inputs)
    outputs = alloc_v2_outputs(inputs, fill=0.0)
    torch.library.opcheck(ops.v2.default, (*outputs, *args))
    torch.library.opcheck(ops.v1.default, (outputs.out, *args))
    key = torch.randn(3, 2, 64, dtype=torch.float16, device=DEV)
    k_cache = torch.zeros_like(inputs.key_cache)
    v_cache = torch.zeros_like(inputs.value_cache)
    slots = torch.tensor([0, -1, 17], dtype=torch.int64, device=DEV)
    torch.library.opcheck(ops.reshape_and_cache.default, (key, key, k_cache, v_cache, slots))


def test_cuda_graph_replay_with_new_lengths(kernel_ops):
    """Capture v2 once, then change seq_lens / block tables in place and replay: the graph must
    pick up the new data (grids come from shapes, nothing is read on the host)."""
    lens_a, lens_b = [700, 5, 1537], [1536, 513, 1]
    max_parts = 4
    a = make_attention_inputs(3, 8, 2, 128, 16, lens_a, dtype=torch.bfloat16, device=DEV, seed=1)
    b = make_attention_inputs(3, 8, 2, 128, 16, lens_b, dtype=torch.bfloat16, device=DEV, seed=2)
    outputs = alloc_v2_outputs(a, max_num_partitions=max_parts)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call_v2(kernel_ops.v2, a, outputs)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call_v2(kernel_ops.v2, a, outputs)
    graph.replay()
    torch.cuda.synchronize()
    assert_v2_matches(outputs, _reference_v2(a, max_parts), lens_a, a.dtype)

    # new lengths, tables and caches, same shapes: copy into the captured tensors
    def fit(src, dst):
        dst.fill_(float("nan") if dst.is_floating_point() else -1)
        region = tuple(slice(0, min(s, t)) for s, t in zip(src.shape, dst.shape))
        dst[region] = src[region]

    big = max(a.num_blocks, b.num_blocks)
    if b.num_blocks > a.num_blocks or b.block_tables.shape[1] > a.block_tables.shape[1]:
        pytest.skip(f"inputs b need a bigger pool than a ({big} blocks)")
    fit(b.key_cache, a.key_cache)
    fit(b.value_cache, a.value_cache)
    fit(b.block_tables, a.block_tables)
    a.seq_lens.copy_(b.seq_lens)
    a.query.copy_(b.query)
    a.seq_lens_list = lens_b
    graph.replay()
    torch.cuda.synchronize()
    assert_v2_matches(outputs, _reference_v2(a, max_parts), lens_b, a.dtype)


def test_long_context_100k(kernel_ops):
    lens = [100_000]
    inputs = make_attention_inputs(1, 32, 8, 128, 16, lens, dtype=torch.bfloat16, device=DEV,
                                   seed=9, extra_blocks=1)
    _check_v2(kernel_ops, inputs, max_num_partitions=math.ceil(100_000 / 512))
    _check_v1(kernel_ops, inputs)


def test_results_are_deterministic(kernel_ops):
    """The same call twice gives the same bits (fixed-order merges, no atomics): v2, v1, decode."""
    inputs = make_attention_inputs(4, 32, 8, 128, 16, [1537, 700, 1, 2049], dtype=torch.bfloat16,
                                   device=DEV, seed=21)
    first = call_v2(kernel_ops.v2, inputs, alloc_v2_outputs(inputs))
    second = call_v2(kernel_ops.v2, inputs, alloc_v2_outputs(inputs))
    torch.cuda.synchronize()
    assert torch.equal(first.out.view(torch.int16), second.out.view(torch.int16))
    v1_a = call_v1(kernel_ops.v1, inputs, alloc_v1_outputs(inputs))
    v1_b = call_v1(kernel_ops.v1, inputs, alloc_v1_outputs(inputs))
    torch.cuda.synchronize()
    assert torch.equal(v1_a.view(torch.int16), v1_b.view(torch.int16))
    dec = testing.make_decode_inputs(4, 32, 8, 128, 16, [1537, 700, 1, 2049], layout="hnd",
                                     dtype=torch.bfloat16, device=DEV, seed=22)
    outs = [testing.call_decode(kernel_ops.decode, dec, alloc_v1_outputs(dec)) for _ in range(2)]
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))


def test_graph_replay_reads_new_fp8_tensor_scales(kernel_ops):
    """v2.scale_tensor captured once; k_scale / v_scale changed in place between replays: the
    kernels read the scales on the device, so each replay uses the current values."""
    lens = [700, 1537]
    inputs = make_attention_inputs(2, 8, 2, 128, 16, lens, dtype=torch.float16,
                                   kv_cache_dtype="fp8_e4m3", scale_as_tensor=True, device=DEV,
                                   seed=23)
    outputs = alloc_v2_outputs(inputs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call_v2(kernel_ops.v2, inputs, outputs)  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call_v2(kernel_ops.v2, inputs, outputs)
    for k_factor, v_factor in ((1.0, 1.0), (2.0, 0.5), (0.25, 3.0)):
        if (k_factor, v_factor) != (1.0, 1.0):
            inputs.k_scale.mul_(k_factor)
            inputs.v_scale.mul_(v_factor)
        graph.replay()
        torch.cuda.synchronize()
        assert_v2_matches(outputs, _reference_v2(inputs), lens, inputs.dtype,
                          inputs.kv_cache_dtype)


def test_decode_graph_replay_with_new_lengths(kernel_ops):
    """decode captured once (grid from block_tables' shape), lengths changed in place."""
    dec = testing.make_decode_inputs(3, 8, 2, 64, 16, [900, 3, 1500], layout="nhd",
                                     dtype=torch.bfloat16, device=DEV, seed=24)
    out = alloc_v1_outputs(dec)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        testing.call_decode(kernel_ops.decode, dec, out)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        testing.call_decode(kernel_ops.decode, dec, out)
    for lens in ([900, 3, 1500], [17, 0, 1499]):  # within each row's blocks
        dec.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        dec.seq_lens_list = lens
        graph.replay()
        torch.cuda.synchronize()
        want = testing.call_decode(reference.decode, dec, alloc_v1_outputs(dec))
        assert_out_matches(out, want, dec.dtype, dec.kv_cache_dtype, name="decode after replay")


def test_cache_over_2_31_elements(kernel_ops):
    """Blocks past element 2^31 of a cache (int64 block offsets): the used blocks of a small
    input are placed at the end of an fp8 pool of more than 2^31 elements per cache."""
    inputs = make_attention_inputs(2, 8, 1, 128, 16, [700, 1300], dtype=torch.bfloat16,
                                   kv_cache_dtype="fp8", device=DEV, seed=25)
    per_block = inputs.key_cache[0].numel()  # elements of one block (1 KV head)
    pool = (1 << 31) // per_block + inputs.num_blocks + 1
    shift = pool - inputs.num_blocks  # every used block id moves past element 2^31
    assert shift * per_block >= 1 << 31
    big_k = torch.empty((pool, *inputs.key_cache.shape[1:]), dtype=torch.uint8, device=DEV)
    big_v = torch.empty((pool, *inputs.value_cache.shape[1:]), dtype=torch.uint8, device=DEV)
    big_k[shift:] = inputs.key_cache
    big_v[shift:] = inputs.value_cache
    used = (torch.arange(inputs.block_tables.shape[1], device=DEV)[None, :]
            < ((inputs.seq_lens + inputs.block_size - 1) // inputs.block_size)[:, None])
    tables = torch.where(used, inputs.block_tables + shift, inputs.block_tables)
    big = dataclasses.replace(inputs, key_cache=big_k, value_cache=big_v,
                              block_tables=tables.to(torch.int32).contiguous(), num_blocks=pool)
    small_out = _check_v2(kernel_ops, inputs).out
    big_out = _check_v2(kernel_ops, big).out
    assert torch.equal(small_out.view(torch.int16), big_out.view(torch.int16))
    _check_v1(kernel_ops, big)
    del big_k, big_v, big
    torch.cuda.empty_cache()


# ---- decode / reshape_and_cache_flash: token-major caches (core/kv_layout.h) ----

# (dtype, kv_cache_dtype, num_heads, num_kv_heads, head_size, block_size, seq_lens, alibi)
DECODE_CASES = [
    (torch.float32, "auto", 8, 2, 128, 16, [1, 511, 0, 513, 1537], False),  # GQA 4
    (torch.bfloat16, "auto", 12, 2, 256, 16, [700, 33], True),  # GQA 6, ALiBi
    (torch.float16, "auto", 8, 8, 80, 5, [511, 1030], False),  # MHA, odd block size
    (torch.float32, "auto", 8, 1, 64, 1, [300, 0, 77], True),  # MQA, block size 1
    (torch.float16, "auto", 24, 2, 64, 16, [700, 3], False),  # GQA 12: two passes
    (torch.float32, "fp8", 8, 2, 64, 16, [300, 1025], True),  # fp8 e4m3
    (torch.bfloat16, "fp8_e4m3", 6, 1, 128, 8, [1, 600], False),
    (torch.float16, "fp8_e5m2", 4, 2, 96, 3, [77, 513], False),  # odd block size
    (torch.bfloat16, "fp8_e5m2", 8, 2, 112, 16, [1100, 2], True),
]
# Every case on NHD and HND; the other layouts spread over the cases ("padded" only where its
# 4-element offset is 16-byte aligned: fp32; other dtypes get the alignment error, tested below).
_OTHER_LAYOUTS = ("combined", "combined_hnd", "mixed")
DECODE_PARAMS = [(c, lay) for i, c in enumerate(DECODE_CASES)
                 for lay in ("nhd", "hnd", _OTHER_LAYOUTS[i % 3])] + [
    (c, "padded") for c in DECODE_CASES if c[0] == torch.float32 and c[1] == "auto"]


def _check_decode(ops, inputs):
    """decode (CUDA) against reference.decode and against v1 (CUDA) on the same K/V in vLLM's
    layout; out pre-filled with NaN."""
    return conformance.require(*conformance.decode(ops, inputs, against_v1=True)).actual


@pytest.mark.parametrize("case,layout", DECODE_PARAMS,
                         ids=[f"{str(c[0])[6:]}-{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-bs{c[5]}"
                              f"{'-alibi' if c[7] else ''}-{lay}" for c, lay in DECODE_PARAMS])
def test_decode_matches_reference(kernel_ops, case, layout):
    dtype, kv, nh, nkv, d, bs, lens, alibi = case
    inputs = testing.make_decode_inputs(len(lens), nh, nkv, d, bs, lens, layout=layout,
                                        dtype=dtype, kv_cache_dtype=kv, use_alibi=alibi,
                                        device=DEV, seed=len(lens) + d)
    if layout == "mixed":
        assert inputs.key_cache.stride() != inputs.value_cache.stride()  # K and V strides differ
    _check_decode(kernel_ops, inputs)


@pytest.mark.parametrize("scale_as_tensor", [False, True], ids=["float-scale", "tensor-scale"])
def test_decode_scale_overloads_and_fused_query(kernel_ops, scale_as_tensor):
    inputs = testing.make_decode_inputs(3, 8, 2, 64, 16, [100, 1100, 3], layout="combined_hnd",
                                        dtype=torch.float32, kv_cache_dtype="fp8_e5m2",
                                        device=DEV, noncontig_query=True,
                                        scale_as_tensor=scale_as_tensor, seed=7)
    assert inputs.query.stride(0) > inputs.num_heads * inputs.head_size
    _check_decode(kernel_ops, inputs)


def test_decode_misaligned_cache_view_is_a_value_error(ops):
    # "padded" views start 4 elements into their storage: 8 bytes for bf16, not the 16 the K
    # vector loads need.
    inputs = testing.make_decode_inputs(2, 4, 2, 64, 16, [30, 5], layout="padded",
                                        dtype=torch.bfloat16, device=DEV, seed=4)
    out = torch.empty(2, 4, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match=r"^paged_attn\.decode: .*16-byte aligned"):
        testing.call_decode(ops.decode, inputs, out)


def test_decode_long_row(kernel_ops):
    inputs = testing.make_decode_inputs(2, 8, 2, 128, 16, [5000, 4097], layout="hnd",
                                        dtype=torch.bfloat16, use_alibi=True, device=DEV, seed=11)
    _check_decode(kernel_ops, inputs)


# ---- v1 / decode: the split of rows across thread blocks (csrc/core/split_plan.h) ----
# One pass when num_seqs * num_kv_heads >= kSplitBlocksPerSm blocks per SM or the block table
# holds <= 2 tiles (256 tokens); else each row is cut into the plan's partitions, phase 1 writes
# scratch the op allocates itself and the reduce kernel merges it. tests/test_split_plan.py checks
# the plan on the host (and that these constants are the header's).
SPLIT_BLOCKS_PER_SM = 8   # split_plan.h kSplitBlocksPerSm
ONE_PASS_MAX_TOKENS = 256  # split_plan.h kMinPartitionTiles * the kernel's 128-token tile


def _sm_count():
    return torch.cuda.get_device_properties(DEV).multi_processor_count


def _splits(num_seqs, num_kv_heads, inputs):
    capacity = inputs.block_tables.shape[1] * inputs.block_size
    return (num_seqs * num_kv_heads < SPLIT_BLOCKS_PER_SM * _sm_count()
            and capacity > ONE_PASS_MAX_TOKENS)


# (name, num_seqs, num_heads, num_kv_heads, head_size, block_size, seq_lens, dtype, alibi): all
# split on any GPU (a handful of rows, tables far wider than 256 tokens).
SPLIT_CASES = [
    ("one-long-row", 1, 4, 1, 64, 16, [100_003], torch.bfloat16, False),
    ("few-rows-kv1", 4, 8, 1, 128, 16, [3000, 0, 1, 4097], torch.float16, True),
    ("gqa8", 3, 64, 8, 128, 16, [2000, 0, 513], torch.bfloat16, False),
    ("empty-rows-and-a-long-one", 5, 8, 2, 64, 8, [0, 20_000, 0, 1, 0], torch.float32, False),
    ("block-12-per-token-v", 2, 12, 4, 96, 12, [1537, 600], torch.float16, True),
    ("gqa12-two-passes", 2, 24, 2, 64, 16, [3001, 129], torch.bfloat16, False),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_split_v1_and_decode_match_reference(kernel_ops, case):
    """v1 and decode on shapes the plan splits: against the oracle (NaN-poisoned unused slots,
    shuffled tables, NaN-prefilled out), decode also against v1."""
    _, s, h, kvh, d, bs, lens, dtype, alibi = case
    dec = testing.make_decode_inputs(s, h, kvh, d, bs, lens, layout="hnd", dtype=dtype,
                                     use_alibi=alibi, device=DEV, seed=sum(lens) % 1000)
    assert _splits(s, kvh, dec.legacy)
    _check_v1(kernel_ops, dec.legacy)
    _check_decode(kernel_ops, dec)


def test_one_pass_when_the_rows_fill_the_gpu(kernel_ops):
    """num_seqs * num_kv_heads >= 8 blocks per SM: one pass, no scratch; and tables of <= 256
    tokens: one pass whatever the row count. Both against the oracle."""
    rows = SPLIT_BLOCKS_PER_SM * _sm_count()
    gen = torch.Generator().manual_seed(31)
    lens = torch.randint(0, 700, (rows,), generator=gen).tolist()
    lens[:3] = [0, 1, 699]
    many = testing.make_decode_inputs(rows, 2, 1, 64, 16, lens, layout="nhd",
                                      dtype=torch.bfloat16, device=DEV, seed=31)
    assert not _splits(rows, 1, many.legacy)
    _check_v1(kernel_ops, many.legacy)
    _check_decode(kernel_ops, many)
    short = testing.make_decode_inputs(3, 8, 2, 128, 16, [200, 0, 90], layout="nhd",
                                       dtype=torch.float16, device=DEV, seed=32)
    assert short.block_tables.shape[1] * 16 <= ONE_PASS_MAX_TOKENS
    assert not _splits(3, 2, short.legacy)
    _check_v1(kernel_ops, short.legacy)
    _check_decode(kernel_ops, short)


# PAGED_ATTN_CUDA_SPLIT (csrc/cuda/kernel_choice.h): other plans for the same call, never another
# result. 256:1 cuts rows into one-tile (128-token) partitions, as many as the grid allows.
SPLIT_SETTINGS = ("off", "1", "32", "256:1")


def _check_split_case_under(kernel_ops, case, env, value, build_key, layout):
    """A SPLIT_CASES row with the CUDA setting env=value (build_info()[build_key] names it): v2,
    v1 and decode against the oracle."""
    _, s, h, kvh, d, bs, lens, dtype, alibi = case
    dec = testing.make_decode_inputs(s, h, kvh, d, bs, lens, layout=layout, dtype=dtype,
                                     use_alibi=alibi, device=DEV, seed=sum(lens) % 997)
    with testing.cuda_kernel_setting(value, env=env):
        setting = paged_attention_ext.build_info()[build_key]
        assert setting.endswith(f"({env}={value})"), setting
        _check_v2(kernel_ops, dec.legacy)
        _check_v1(kernel_ops, dec.legacy)
        _check_decode(kernel_ops, dec)


@pytest.mark.parametrize("split", SPLIT_SETTINGS)
@pytest.mark.parametrize("case", [SPLIT_CASES[1], SPLIT_CASES[4]], ids=lambda c: c[0])
def test_every_split_setting_gives_the_reference(kernel_ops, split, case):
    _check_split_case_under(kernel_ops, case, testing.CUDA_SPLIT_ENV, split, "cuda_split", "nhd")


@pytest.mark.parametrize("case", SPLIT_CASES[:4], ids=[c[0] for c in SPLIT_CASES[:4]])
def test_programmatic_reduce_launch_gives_the_reference(kernel_ops, case):
    """PAGED_ATTN_CUDA_PDL=1: every split's reduce (v2's, and v1's / decode's) launched with
    programmatic dependent launch where the code is sm_90+ (grid_dependency.cuh: the reduce may
    start while phase 1 finishes, and waits for it before reading the scratch)."""
    _check_split_case_under(kernel_ops, case, testing.CUDA_PDL_ENV, "1", "cuda_pdl", "hnd")


@pytest.mark.parametrize("env,value,op", [(testing.CUDA_SPLIT_ENV, "lots", "v1"),
                                          (testing.CUDA_PDL_ENV, "yes", "v2")])
def test_a_bad_cuda_setting_is_a_clear_error(ops, env, value, op):
    inputs = make_attention_inputs(1, 4, 2, 64, 16, [30], dtype=torch.float16, device=DEV)
    call = {"v1": lambda: call_v1(ops.v1, inputs, alloc_v1_outputs(inputs)),
            "v2": lambda: call_v2(ops.v2, inputs, alloc_v2_outputs(inputs))}
    with testing.cuda_kernel_setting(value, env=env):
        with pytest.raises(RuntimeError, match=f"{env}='{value}' is not a"):
            call[op]()
        if env == testing.CUDA_SPLIT_ENV:
            call["v2"]()  # v2's partitions are the contract's: the split setting is not read


@pytest.mark.parametrize("op", ["v1", "decode"])
def test_split_bad_data_gives_nan_rows(kernel_ops, op):
    """On the split path the reduce kernel writes the NaN rows: a used block id past the pool or
    negative, a negative length, a length past the table's capacity."""
    lens = [600, 600, 600, 600, 600]
    dec = testing.make_decode_inputs(5, 8, 2, 64, 16, lens, layout="nhd", dtype=torch.float16,
                                     device=DEV, seed=33)
    assert _splits(5, 2, dec.legacy)
    bt = dec.block_tables  # shared with dec.legacy
    bt[1, 30] = dec.num_blocks + 1000
    bt[2, 0] = -7
    dec.seq_lens[3] = -1
    dec.seq_lens[4] = bt.shape[1] * dec.block_size + 1
    if op == "v1":
        out = call_v1(kernel_ops.v1, dec.legacy, alloc_v1_outputs(dec.legacy, fill=0.0))
    else:
        out = testing.call_decode(kernel_ops.decode, dec, alloc_v1_outputs(dec, fill=0.0))
    torch.cuda.synchronize()
    assert _nan_rows(out) == [False, True, True, True, True]
    good = testing.make_decode_inputs(5, 8, 2, 64, 16, lens, layout="nhd", dtype=torch.float16,
                                      device=DEV, seed=33)
    expected = call_v1(reference.paged_attention_v1, good.legacy, alloc_v1_outputs(good.legacy))
    assert_out_matches(out[:1], expected[:1], torch.float16)


@pytest.mark.parametrize("pdl", ["0", "1"])
@pytest.mark.parametrize("op", ["v1", "decode"])
def test_split_under_graph_replay_with_new_lengths(kernel_ops, op, pdl):
    """v1 / decode captured once on a split shape (the scratch is allocated inside the capture,
    from the graph's pool; the plan comes from shapes), then replayed with new lengths written
    in place, including empty rows; with the reduce launched plainly and with programmatic
    dependent launch (PAGED_ATTN_CUDA_PDL=1: a programmatic edge in the graph on sm_90+)."""
    with testing.cuda_kernel_setting(pdl, env=testing.CUDA_PDL_ENV):
        _split_under_graph_replay(kernel_ops, op)


def _split_under_graph_replay(kernel_ops, op):
    lens = [900, 3, 1500, 64]
    dec = testing.make_decode_inputs(4, 16, 2, 128, 16, lens, layout="nhd", dtype=torch.bfloat16,
                                     device=DEV, seed=34)
    assert _splits(4, 2, dec.legacy)
    out = alloc_v1_outputs(dec)

    def call():
        if op == "v1":
            call_v1(kernel_ops.v1, dec.legacy, out)
        else:
            testing.call_decode(kernel_ops.decode, dec, out)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    for new_lens in (lens, [17, 0, 1499, 0], [0, 0, 1, 63]):  # within each row's blocks
        dec.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        dec.seq_lens_list = new_lens
        dec.legacy.seq_lens_list = new_lens
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = call_v1(reference.paged_attention_v1, dec.legacy, alloc_v1_outputs(dec.legacy))
        assert_out_matches(out, want, dec.dtype, name=f"{op} after replay with {new_lens}")


def test_split_results_are_deterministic(kernel_ops):
    """The same split call twice gives the same bits (the plan depends on shapes only)."""
    dec = testing.make_decode_inputs(2, 32, 8, 128, 16, [5000, 700], layout="hnd",
                                     dtype=torch.bfloat16, device=DEV, seed=35)
    assert _splits(2, 8, dec.legacy)
    v1 = [call_v1(kernel_ops.v1, dec.legacy, alloc_v1_outputs(dec.legacy)) for _ in range(2)]
    de = [testing.call_decode(kernel_ops.decode, dec, alloc_v1_outputs(dec)) for _ in range(2)]
    torch.cuda.synchronize()
    assert torch.equal(v1[0].view(torch.int16), v1[1].view(torch.int16))
    assert torch.equal(de[0].view(torch.int16), de[1].view(torch.int16))


@pytest.mark.parametrize("dtype,kv", [(torch.float32, "auto"), (torch.bfloat16, "auto"),
                                      (torch.float16, "auto"), (torch.float32, "fp8"),
                                      (torch.bfloat16, "fp8_e4m3"), (torch.float16, "fp8_e5m2")])
@pytest.mark.parametrize("layout", testing.DECODE_LAYOUTS)
def test_reshape_and_cache_flash_matches_reference(ops, dtype, kv, layout):
    """key / value with more rows than slot_mapping (vLLM: the rest is padding, never read: NaN
    there), slices of a fused tensor; negative slots skipped; fp8 saturated; bit-exact."""
    num_rows, num_tokens, kvh, d, bs, num_blocks = 41, 37, 2, 48, 5, 11
    g = torch.Generator().manual_seed(5)
    fused = torch.randn(num_rows, (4 + 2 * kvh) * d, generator=g) * 30  # fp8 saturates too
    fused[num_tokens:] = float("nan")  # padding rows
    fused = fused.to(dtype).to(DEV)
    key = fused[:, 4 * d:(4 + kvh) * d].view(num_rows, kvh, d)
    value = fused[:, (4 + kvh) * d:].view(num_rows, kvh, d)
    slots = torch.randperm(num_blocks * bs, generator=g)[:num_tokens]
    slots[::4] = -1
    slots = slots.to(DEV)
    cache_dtype = dtype if kv == "auto" else torch.uint8
    if cache_dtype == torch.uint8:
        k = torch.randint(0, 256, (num_blocks, bs, kvh, d), generator=g).to(torch.uint8)
        v = torch.randint(0, 256, (num_blocks, bs, kvh, d), generator=g).to(torch.uint8)
    else:
        k = torch.randn(num_blocks, bs, kvh, d, generator=g).to(cache_dtype)
        v = torch.randn(num_blocks, bs, kvh, d, generator=g).to(cache_dtype)
    kc, vc, _ = testing.nhd_cache_views(k.to(DEV), v.to(DEV), layout)
    for k_scale, v_scale in ((0.37, 1.9), (torch.tensor(0.37, device=DEV),
                                           torch.tensor(1.9, device=DEV))):
        written = conformance.cache_write(ops, "reshape_and_cache_flash", key, value, kc, vc,
                                          slots, kv, k_scale, v_scale)
        kc, vc = conformance.require(written).actual  # the next write goes on top


def test_flash_cache_then_decode_round_trip(kernel_ops):
    """Tokens appended with reshape_and_cache_flash into an HND cache (a view), then read back
    by decode: the oracle's output on the same cache."""
    inputs = testing.make_decode_inputs(2, 8, 2, 64, 16, [40, 90], layout="hnd",
                                        dtype=torch.bfloat16, device=DEV, seed=9)
    g = torch.Generator().manual_seed(1)
    new_k = torch.randn(2, 2, 64, generator=g).to(torch.bfloat16).to(DEV)
    new_v = torch.randn(2, 2, 64, generator=g).to(torch.bfloat16).to(DEV)
    tables = inputs.block_tables.cpu()
    slots = [int(tables[s, n // 16]) * 16 + n % 16 for s, n in enumerate(inputs.seq_lens_list)]
    kernel_ops.reshape_and_cache_flash(new_k, new_v, inputs.key_cache, inputs.value_cache,
                                       torch.tensor(slots, device=DEV))
    inputs.seq_lens += 1
    inputs.seq_lens_list = [n + 1 for n in inputs.seq_lens_list]
    conformance.require(*conformance.decode(kernel_ops, inputs))
