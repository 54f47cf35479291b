"""What only the CUDA kernels (csrc/cuda) have: the kernel choice and its rule, the v1 / decode
split of rows across thread blocks and its settings, programmatic dependent launch, CUDA-graph
capture and replay, bad data giving NaN rows (a used block id past the pool or negative, a
negative length, a row past its table or near INT32_MAX, scratch too small), caches past element
2^31, bitwise determinism, their limits (head sizes, alignment, mixed devices) and opcheck. Each
kernel choice against the oracle on the shared cases is tests/test_conformance.py.

test_cuda_kernels_registered needs only the dispatcher: it runs in every CUDA build, GPU or not, and
fails unless every op overload has a compiled CUDA kernel (so a broken CUDA build cannot hide behind
the PyTorch fallback that serves CUDA tensors when no kernel is compiled); where a GPU is present it
fails for a build without CUDA too. The other tests run kernels: only where torch sees a CUDA device
(skipped otherwise, with the reason). Inputs come from paged_attention_ext.tools.testing (sharp
softmax, shuffled block tables with garbage past each row, NaN-poisoned unused cache slots,
outputs pre-filled with NaN).
"""

import dataclasses

import pytest
import torch

import paged_attention_ext
from conftest import registered_ops
from paged_attention_ext import reference, schemas
from paged_attention_ext.tools import backends, conformance, testing
from paged_attention_ext.tools.testing import (alloc_v1_outputs, alloc_v2_outputs,
                                               assert_out_matches, assert_v2_matches, call_v1,
                                               call_v2, make_attention_inputs)
from support import backend_params, fatbin

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.cuda

DEV = "cuda"


@pytest.fixture
def ops(monkeypatch):
    """The CUDA kernels' ops (skipped without a GPU or without compiled CUDA kernels)."""
    with backend_params.activate(backend_params.Param("cuda"), monkeypatch) as cuda:
        yield cuda.ops


# The CUDA attention kernels (csrc/cuda/kernel_choice.h): the graph, split and robustness tests
# here (and the oracle comparisons of tests/test_conformance.py) run once per kernel, each forced
# with PAGED_ATTN_CUDA_KERNEL. "mma" runs the
# pipelined kernel with the GQA group on tensor cores for 16-bit queries with GQA >= 3
# (testing.on_tensor_cores) and the plain pipelined kernel for other shapes.
KERNELS = backend_params.CUDA_KERNELS
KERNEL_ENV = testing.CUDA_KERNEL_ENV
_kernel_setting = testing.cuda_kernel_setting  # PAGED_ATTN_CUDA_KERNEL=value, read again


@pytest.fixture(params=KERNELS)
def kernel_ops(request, monkeypatch):
    """The CUDA ops with PAGED_ATTN_CUDA_KERNEL set to the parameter for the test, and afterwards
    the proof that this kernel, and only this one, ran: the extension's launch counters
    (_C.cuda_attention_launches; support/backend_params.py). A test cannot pass on another
    kernel. "mma" may also count pipelined launches (the shapes tensor cores do not take;
    test_mma_choice_follows_the_rule checks which shapes those are)."""
    with backend_params.activate(backend_params.Param("cuda", request.param), monkeypatch,
                                 lambda: getattr(request.node, "passed_call", False)) as cuda:
        yield cuda.ops


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


def test_unsupported_head_size(ops):
    inputs = make_attention_inputs(1, 2, 1, 48, 16, [10], dtype=torch.float16, device=DEV)
    with pytest.raises(ValueError, match="Unsupported head size: 48"):
        call_v1(ops.v1, inputs, alloc_v1_outputs(inputs))


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


# ---- decode: token-major caches (core/kv_layout.h) ----

def _check_decode(ops, inputs):
    """decode (CUDA) against reference.decode and against v1 (CUDA) on the same K/V in vLLM's
    layout; out pre-filled with NaN."""
    return conformance.require(*conformance.decode(ops, inputs, against_v1=True)).actual


def test_decode_misaligned_cache_view_is_a_value_error(ops):
    # "padded" views start 4 elements into their storage: 8 bytes for bf16, not the 16 the K
    # vector loads need.
    inputs = testing.make_decode_inputs(2, 4, 2, 64, 16, [30, 5], layout="padded",
                                        dtype=torch.bfloat16, device=DEV, seed=4)
    out = torch.empty(2, 4, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match=r"^paged_attn\.decode: .*16-byte aligned"):
        testing.call_decode(ops.decode, inputs, out)


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
