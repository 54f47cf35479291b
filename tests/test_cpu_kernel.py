"""The compiled CPU kernels (csrc/cpu) against the oracle (paged_attention_ext.reference).

Every case runs on every CPU kernel variant of this build (avx512-bf16, avx512, avx2-fma, scalar
on x86-64; neon, scalar on aarch64) that this CPU executes, each forced with
PAGED_ATTN_CPU_KERNEL and checked to be the one that runs; a variant the CPU cannot execute is
skipped with the reason (the NEON variant is also run under qemu by tests/test_cpu_kernel_cross.py). Inputs come from paged_attention_ext.tools.testing: N(0,1) q/k/v
with a sharp softmax, shuffled block tables with garbage past each row, NaN in every cache slot
no sequence uses, outputs pre-filled with NaN. v2 is compared on all four outputs (scratch only
in the partitions a row has), v1 on `out`; reshape_and_cache bit for bit.
decode runs on token-major caches (testing.DECODE_LAYOUTS: NHD, HND as a transposed view, K and V
of a combined tensor, mixed, padded strides) against reference.decode, and against v1 on the same
K/V in vLLM's layout; reshape_and_cache_flash bit for bit against its oracle.
"""

import threading

import pytest
import torch

import paged_attention_ext
from paged_attention_ext import reference
from paged_attention_ext.core import key_chunk_elements
from paged_attention_ext.tools import backends, conformance, testing
from support.blocksparse import CASES as BLOCKSPARSE_CASES
from support.blocksparse import inputs as blocksparse_inputs
from support.blocksparse import mask as blocksparse_mask
from support.blocksparse import poison_skipped

pytestmark = pytest.mark.skipif(not paged_attention_ext.extension_loaded(),
                                reason=f"compiled extension: {paged_attention_ext.extension_status()}")

# The compiled CPU kernel by name (tools.backends: active only when _C's CPU kernels serve every
# op), or None where the extension is not loaded (every test here skips then).
OPS = backends.backend("cpu-kernel").ops if paged_attention_ext.extension_loaded() else None


VARIANTS = paged_attention_ext.cpu_kernel_variants()  # [(name, runnable, note)], best first here


@pytest.fixture(params=[name for name, _, _ in VARIANTS] or ["none"])
def kernel(request, monkeypatch):
    """Which CPU kernel variant runs: the launcher reads PAGED_ATTN_CPU_KERNEL on every call."""
    status = {name: (ok, why) for name, ok, why in VARIANTS}
    ok, why = status.get(request.param, (False, "no compiled variants"))
    if not ok:
        pytest.skip(f"CPU kernel variant {request.param} cannot run here: {why}")
    monkeypatch.setenv("PAGED_ATTN_CPU_KERNEL", request.param)
    assert paged_attention_ext.cpu_kernel() == request.param  # the named kernel, not another
    return request.param


def check_v1_v2(inp, extra_partitions=0, blocksparse=testing.DENSE):
    """Run v2 and v1 (kernel) and the oracle's v2 on the same inputs; compare everything."""
    p = max(1, max(map(testing.num_partitions, inp.seq_lens_list), default=0))
    conformance.require(*conformance.attention(OPS, inp, p + extra_partitions, blocksparse))


# (dtype, kv_cache_dtype, num_heads, num_kv_heads, head_size, block_size, seq_lens, alibi)
CASES = [
    (torch.float32, "auto", 8, 2, 128, 16, [1, 511, 512, 513, 0, 1537], False),  # GQA 4
    (torch.bfloat16, "auto", 12, 2, 256, 16, [700, 33], True),  # GQA 6, ALiBi
    (torch.float16, "auto", 8, 8, 80, 5, [511, 1030], False),  # MHA, odd block size
    (torch.float32, "auto", 8, 1, 64, 8, [300, 1025], True),  # MQA (GQA 8)
    (torch.float32, "auto", 6, 2, 24, 32, [77, 600], False),  # head 24 (odd multiple of x=4)
    (torch.bfloat16, "auto", 4, 1, 40, 16, [513, 5], False),  # head 40 (odd multiple of x=8)
    (torch.float32, "fp8", 8, 2, 64, 16, [300, 1025], True),  # fp8 e4m3, x = 16
    (torch.bfloat16, "fp8_e4m3", 6, 1, 128, 8, [1, 600], False),
    (torch.float16, "fp8_e5m2", 4, 2, 48, 32, [77, 513], False),  # head 48 = 3 * 16
    (torch.float32, "auto", 4, 2, 32, 1, [5, 513], False),  # block size 1
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-h{c[2]}/{c[3]}"
                         f"-d{c[4]}-bs{c[5]}{'-alibi' if c[7] else ''}")
def test_matches_oracle(kernel, case):
    dtype, kv, nh, nkv, d, bs, lens, alibi = case
    inp = testing.make_attention_inputs(len(lens), nh, nkv, d, bs, lens, dtype=dtype,
                                        kv_cache_dtype=kv, use_alibi=alibi, seed=len(lens) + d)
    check_v1_v2(inp)


@pytest.mark.parametrize("case", BLOCKSPARSE_CASES, ids=[c[0] for c in BLOCKSPARSE_CASES])
def test_blocksparse_matches_oracle(kernel, case):
    """Blocksparse (CONTRACT.md): every (cache block, KV head) no query head attends is NaN, so a
    block the kernel reads but should skip shows up as NaN."""
    inp = blocksparse_inputs(case, seed=21)
    check_v1_v2(poison_skipped(inp, blocksparse_mask(inp, case[2])), blocksparse=case[2])


@pytest.mark.parametrize("layout", testing.CACHE_LAYOUTS)
def test_caches_with_outer_strides_of_a_bigger_tensor(kernel, layout):
    # (block, head) strides of a view into a bigger NaN-filled allocation: honoured, never read.
    for dtype, kv in ((torch.bfloat16, "auto"), (torch.float32, "fp8_e4m3")):
        inp = testing.make_attention_inputs(3, 8, 2, 64, 16, [1, 600, 1025], dtype=dtype,
                                            kv_cache_dtype=kv, seed=13)
        check_v1_v2(testing.with_strided_caches(inp, layout))


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_scale_overloads_and_fused_query(kernel, scale_as_tensor):
    """k_scale / v_scale as floats and as tensors (the .scale_tensor overload); the query a slice
    of a fused qkv tensor (NaN elsewhere); scratch with more partitions than needed."""
    inp = testing.make_attention_inputs(3, 8, 2, 64, 16, [100, 1100, 3], dtype=torch.float32,
                                        kv_cache_dtype="fp8_e5m2", noncontig_query=True,
                                        scale_as_tensor=scale_as_tensor, seed=7)
    assert inp.query.stride(0) > inp.num_heads * inp.head_size
    check_v1_v2(inp, extra_partitions=2)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_auto_caches_ignore_the_kv_scales(kernel, scale_as_tensor):
    """kv_cache_dtype "auto": k_scale / v_scale are not applied (only fp8 values are decoded
    byte * scale; the oracle ignores them), whatever their form."""
    inp = testing.make_attention_inputs(3, 8, 2, 64, 16, [100, 600, 7], dtype=torch.bfloat16,
                                        use_alibi=True, scale_as_tensor=scale_as_tensor, seed=23)
    inp.k_scale = torch.tensor(0.37) if scale_as_tensor else 0.37
    inp.v_scale = torch.tensor(1.9) if scale_as_tensor else 1.9
    check_v1_v2(inp)
    dec = testing.make_decode_inputs(2, 8, 2, 64, 16, [100, 600], layout="hnd",
                                     scale_as_tensor=scale_as_tensor, seed=24)
    dec.k_scale, dec.v_scale = inp.k_scale, inp.v_scale
    conformance.require(*conformance.decode(OPS, dec))


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("which", ["key", "value"])
def test_fp8_nan_byte_in_an_attended_slot_reaches_the_output(kernel, kv, which):
    """value = decoded byte * scale (CONTRACT.md), the NaN byte (0x7F) included: a NaN in an
    attended slot reaches exactly the outputs it reaches in the oracle (a K NaN: every dim of the
    query heads of its KV head; a V NaN: that one dim of them). A vector decode mapping the NaN
    byte to a finite value (e4m3's 0x7F is 480 by its exponent bits) would also make every read
    of the NaN-poisoned unused slots of fp8 caches invisible to the other tests."""
    inp = testing.make_attention_inputs(2, 8, 2, 64, 16, [40, 21], kv_cache_dtype=kv, seed=21)
    block = int(inp.block_tables[0, 1])  # row 0's second block: tokens 16..31, all attended
    if which == "key":  # [num_blocks, kv_heads, head_size / 16, block_size, 16]: token 19, dim 37
        inp.key_cache[block, 1, 2, 3, 5] = testing.FP8_NAN_BYTE
    else:  # [num_blocks, kv_heads, head_size, block_size]: token 19, dim 7
        inp.value_cache[block, 1, 7, 3] = testing.FP8_NAN_BYTE
    want = testing.call_v1(reference.paged_attention_v1, inp, testing.alloc_v1_outputs(inp))
    # The oracle: NaN only in row 0's query heads 4..7 (KV head 1 of a GQA group of 4).
    assert want[0, 4:].isnan().any() and not want[0, :4].isnan().any()
    assert not want[1].isnan().any()
    got_v1 = testing.call_v1(OPS.v1, inp, testing.alloc_v1_outputs(inp))
    got_v2 = testing.call_v2(OPS.v2, inp, testing.alloc_v2_outputs(inp)).out
    atol, rtol = testing.tolerances(inp.dtype, kv)
    for name, got in (("v1", got_v1), ("v2", got_v2)):
        assert torch.equal(got.isnan(), want.isnan()), f"{name}: NaN pattern differs"
        torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)


# ---- every fp8 byte through each variant's own vector decode ----

@pytest.mark.parametrize("kv,side,layout", conformance.EVERY_BYTE_CASES,
                         ids=["-".join(c) for c in conformance.EVERY_BYTE_CASES])
def test_every_fp8_byte_decodes_right(kernel, kv, side, layout):
    """All 256 bytes of the format through V (out is each decoded byte: compared exactly, NaN and
    inf included) or through K (a logit of +-1 per byte: compared at fp32's tolerance), in
    vLLM's layout (v1) and token-major (decode); testing.every_fp8_byte_inputs says how. The
    random caches of the other tests hold a few octaves of bytes around the scale: a vector
    decode turning +-448 into NaN passed every one of them."""
    conformance.require(conformance.every_fp8_byte(OPS, kv, side, layout))


def test_all_rows_empty(kernel):
    inp = testing.make_attention_inputs(2, 4, 2, 32, 16, [0, 0], seed=3)
    out = testing.call_v1(OPS.v1, inp, testing.alloc_v1_outputs(inp))
    assert torch.equal(out, torch.zeros_like(out))
    outs = testing.call_v2(OPS.v2, inp, testing.alloc_v2_outputs(inp))
    assert torch.equal(outs.out, torch.zeros_like(outs.out))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_rows_many_partitions(kernel, dtype):
    inp = testing.make_attention_inputs(2, 8, 2, 128, 16, [5000, 4097], dtype=dtype,
                                        use_alibi=True, seed=11)
    check_v1_v2(inp)


def test_concurrent_python_threads():
    """Many Python threads calling the op at once (each with its own inputs) get correct results:
    the kernel keeps no shared mutable state."""
    inputs = [testing.make_attention_inputs(2, 8, 2, 64, 16, [300 + 37 * i, 700], seed=100 + i)
              for i in range(6)]
    expected = [testing.call_v2(reference.paged_attention_v2, inp,
                                testing.alloc_v2_outputs(inp)).out for inp in inputs]
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                out = testing.call_v1(OPS.v1, inputs[i], testing.alloc_v1_outputs(inputs[i]))
                testing.assert_out_matches(out, expected[i], torch.float32)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ---- reshape_and_cache ----

def _cache_pair(num_blocks, kvh, d, bs, cache_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = key_chunk_elements(cache_dtype)
    if cache_dtype == torch.uint8:
        kc = torch.randint(0, 256, (num_blocks, kvh, d // x, bs, x), generator=g).to(torch.uint8)
        vc = torch.randint(0, 256, (num_blocks, kvh, d, bs), generator=g).to(torch.uint8)
    else:
        kc = torch.randn(num_blocks, kvh, d // x, bs, x, generator=g).to(cache_dtype)
        vc = torch.randn(num_blocks, kvh, d, bs, generator=g).to(cache_dtype)
    return kc, vc


def _prefill_slots(num_tokens, num_blocks, bs, g):
    """Slots as prefills write them: sequences of consecutive tokens, each starting mid-block and
    going on into its next block (the first sequence's blocks adjacent in the pool, so its slot
    numbers run on across a block boundary; the others' blocks shuffled), every 7th token
    padding (-1). Each block belongs to one sequence: no slot is written twice."""
    blocks = [0, 1, 2] + (torch.randperm(num_blocks - 3, generator=g) + 3).tolist()
    slots, first = [], True
    while len(slots) < num_tokens:
        block, offset = blocks.pop(0), int(torch.randint(0, bs, (), generator=g))
        length = int(torch.randint(1, 3 * bs, (), generator=g))
        if first:  # from block 0's last-but-one slot through block 1 into block 2
            offset, length, first = bs - 2, bs + 3, False
        for _ in range(length):
            if offset == bs:
                block, offset = blocks.pop(0), 0
            slots.append(block * bs + offset)
            offset += 1
    slots = torch.tensor(slots[:num_tokens])
    slots[6::7] = -1
    runs_on = (slots[1:] == slots[:-1] + 1) & (slots[:-1] >= 0)
    assert runs_on.any() and (runs_on & (slots[1:] % bs == 0)).any()  # across a block boundary
    return slots


CACHE_WRITE_SLOTS = {  # name -> (slots(num_tokens, num_blocks, block_size, generator))
    "random": lambda n, nb, bs, g: torch.randperm(nb * bs, generator=g)[:n].masked_fill(
        torch.arange(n) % 4 == 0, -1),  # padding tokens are skipped
    "prefill": _prefill_slots,
}


@pytest.fixture(params=["one thread", "a thread per token"])
def cache_write_threads(request, monkeypatch):
    """The writes on one thread, or split token by token over 4 threads (a run of consecutive
    slots cut at a thread's boundary)."""
    if request.param == "one thread":
        monkeypatch.setenv("PAGED_ATTN_CPU_KV_BYTES_PER_THREAD", str(1 << 40))
        yield
        return
    monkeypatch.setenv("PAGED_ATTN_CPU_KV_BYTES_PER_THREAD", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype,kv", [(torch.float32, "auto"), (torch.bfloat16, "auto"),
                                      (torch.float16, "auto"), (torch.float32, "fp8"),
                                      (torch.bfloat16, "fp8_e4m3"), (torch.float16, "fp8_e5m2")])
@pytest.mark.parametrize("scale_as_tensor", [False, True])
@pytest.mark.parametrize("slot_kind", CACHE_WRITE_SLOTS)
def test_reshape_and_cache_bit_exact(dtype, kv, scale_as_tensor, slot_kind, cache_write_threads):
    num_tokens, kvh, d, bs, num_blocks = 37, 2, 48, 5, 24
    g = torch.Generator().manual_seed(5)
    # key / value: slices of a fused [rows, (q + k + v) heads * d] tensor (stride(0) > kvh * d)
    # whose last 3 rows are NaN CUDA-graph padding: slot_mapping has num_tokens entries (vLLM)
    fused = torch.randn(num_tokens + 3, (4 + 2 * kvh) * d, generator=g) * 30  # fp8 saturates too
    fused[0, 4 * d] = float("nan")
    fused[num_tokens:] = float("nan")
    fused = fused.to(dtype)
    key = fused[:, 4 * d:(4 + kvh) * d].view(num_tokens + 3, kvh, d)
    value = fused[:, (4 + kvh) * d:].view(num_tokens + 3, kvh, d)
    slots = CACHE_WRITE_SLOTS[slot_kind](num_tokens, num_blocks, bs, g)
    cache_dtype = dtype if kv == "auto" else torch.uint8
    kc, vc = _cache_pair(num_blocks, kvh, d, bs, cache_dtype, seed=6)
    k_scale, v_scale = (1.0, 1.0) if kv == "auto" else (0.37, 1.9)
    if scale_as_tensor:
        k_scale, v_scale = torch.tensor(k_scale), torch.tensor(v_scale)
    conformance.require(conformance.cache_write(OPS, "reshape_and_cache", key, value, kc, vc,
                                                slots, kv, k_scale, v_scale))


def test_cache_then_attend_round_trip(kernel):
    """Tokens written with reshape_and_cache, then read back by v1: the same output as the oracle
    on the same cache (end to end through the cache layout)."""
    inp = testing.make_attention_inputs(2, 8, 2, 64, 16, [40, 90], dtype=torch.bfloat16, seed=9)
    g = torch.Generator().manual_seed(1)
    new_k = torch.randn(2, 2, 64, generator=g).to(torch.bfloat16)
    new_v = torch.randn(2, 2, 64, generator=g).to(torch.bfloat16)
    # append one token to each sequence: slot seq_len of its table
    slots = []
    for s, n in enumerate(inp.seq_lens_list):
        slots.append(int(inp.block_tables[s, n // 16]) * 16 + n % 16)
    OPS.reshape_and_cache(new_k, new_v, inp.key_cache, inp.value_cache, torch.tensor(slots))
    inp.seq_lens += 1
    inp.seq_lens_list = [n + 1 for n in inp.seq_lens_list]
    inp.max_seq_len += 1
    check_v1_v2(inp)


# ---- decode: token-major caches (core/kv_layout.h), the kernel's second form ----

# (dtype, kv_cache_dtype, num_heads, num_kv_heads, head_size, block_size, seq_lens, alibi)
DECODE_CASES = [
    (torch.float32, "auto", 8, 2, 128, 16, [1, 511, 0, 513, 1537], False),  # GQA 4, 4 partitions
    (torch.bfloat16, "auto", 12, 2, 256, 16, [700, 33], True),  # GQA 6, ALiBi
    (torch.float16, "auto", 8, 8, 80, 5, [511, 1030], False),  # MHA, odd block size, 80 = 5 x 16
    (torch.float32, "auto", 8, 1, 64, 1, [300, 0, 77], True),  # MQA, block size 1
    (torch.float32, "auto", 6, 2, 20, 32, [77, 600], False),  # head 20: a 4-dim tail row
    (torch.bfloat16, "auto", 4, 1, 40, 7, [513, 5], False),  # head 40: an 8-dim tail, bs 7
    (torch.float32, "fp8", 8, 2, 64, 16, [300, 1025], True),  # fp8 e4m3
    (torch.bfloat16, "fp8_e4m3", 6, 1, 128, 8, [1, 600], False),
    (torch.float16, "fp8_e5m2", 4, 2, 48, 3, [77, 513], False),  # odd block size
    (torch.bfloat16, "fp8_e5m2", 8, 2, 112, 16, [1100, 2], True),
    # bf16 on avx512-bf16's dot-product QK / PV, every register tile: one head a tile with a
    # 32-dim chunk past head 96, two heads with head 160 (5 chunks), three with a 8-dim last chunk
    (torch.bfloat16, "auto", 8, 8, 96, 5, [511, 1030, 2], False),
    (torch.bfloat16, "auto", 4, 2, 160, 16, [1537, 19], False),
    (torch.bfloat16, "auto", 6, 2, 72, 3, [77, 600, 1], True),
]
# every case on NHD and HND; the other layouts spread over the cases
DECODE_PARAMS = [(c, lay) for i, c in enumerate(DECODE_CASES)
                 for lay in ("nhd", "hnd", testing.DECODE_LAYOUTS[2 + i % 4])]


def check_decode(inp):
    """decode (kernel) against reference.decode and against v1 (kernel) on the same K/V in
    vLLM's layout; out pre-filled with NaN."""
    conformance.require(*conformance.decode(OPS, inp, against_v1=True))


@pytest.mark.parametrize("case,layout", DECODE_PARAMS,
                         ids=[f"{str(c[0])[6:]}-{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-bs{c[5]}"
                              f"{'-alibi' if c[7] else ''}-{lay}" for c, lay in DECODE_PARAMS])
def test_decode_matches_oracle(kernel, case, layout):
    dtype, kv, nh, nkv, d, bs, lens, alibi = case
    inp = testing.make_decode_inputs(len(lens), nh, nkv, d, bs, lens, layout=layout, dtype=dtype,
                                     kv_cache_dtype=kv, use_alibi=alibi, seed=len(lens) + d)
    if layout == "mixed":
        assert inp.key_cache.stride() != inp.value_cache.stride()  # K and V strides differ
    check_decode(inp)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_decode_scale_overloads_and_fused_query(kernel, scale_as_tensor):
    inp = testing.make_decode_inputs(3, 8, 2, 64, 16, [100, 1100, 3], layout="combined_hnd",
                                     dtype=torch.float32, kv_cache_dtype="fp8_e5m2",
                                     noncontig_query=True, scale_as_tensor=scale_as_tensor, seed=7)
    assert inp.query.stride(0) > inp.num_heads * inp.head_size
    check_decode(inp)


def test_decode_all_rows_empty(kernel):
    inp = testing.make_decode_inputs(2, 4, 2, 32, 16, [0, 0], layout="hnd", seed=3)
    out = testing.call_decode(OPS.decode, inp, torch.full((2, 4, 32), float("nan")))
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_decode_long_rows(kernel, layout):
    inp = testing.make_decode_inputs(2, 8, 2, 128, 16, [5000, 4097], layout=layout,
                                     dtype=torch.bfloat16, use_alibi=True, seed=11)
    check_decode(inp)


def _flash_caches(layout, num_blocks, bs, kvh, d, cache_dtype, seed):
    """Random token-major caches (views as testing.nhd_cache_views lays them out)."""
    g = torch.Generator().manual_seed(seed)
    if cache_dtype == torch.uint8:
        k = torch.randint(0, 256, (num_blocks, bs, kvh, d), generator=g).to(torch.uint8)
        v = torch.randint(0, 256, (num_blocks, bs, kvh, d), generator=g).to(torch.uint8)
    else:
        k = torch.randn(num_blocks, bs, kvh, d, generator=g).to(cache_dtype)
        v = torch.randn(num_blocks, bs, kvh, d, generator=g).to(cache_dtype)
    kc, vc, _ = testing.nhd_cache_views(k, v, layout)
    return kc, vc


@pytest.mark.parametrize("dtype,kv", [(torch.float32, "auto"), (torch.bfloat16, "auto"),
                                      (torch.float16, "auto"), (torch.float32, "fp8"),
                                      (torch.bfloat16, "fp8_e4m3"), (torch.float16, "fp8_e5m2")])
@pytest.mark.parametrize("layout", testing.DECODE_LAYOUTS)
@pytest.mark.parametrize("slot_kind", CACHE_WRITE_SLOTS)
def test_reshape_and_cache_flash_bit_exact(dtype, kv, layout, slot_kind, cache_write_threads):
    """key / value with more rows than slot_mapping (vLLM: the rest is padding, never read: NaN
    there), slices of a fused tensor; negative slots skipped; fp8 saturated."""
    num_rows, num_tokens, kvh, d, bs, num_blocks = 41, 37, 2, 48, 5, 24
    g = torch.Generator().manual_seed(5)
    fused = torch.randn(num_rows, (4 + 2 * kvh) * d, generator=g) * 30  # fp8 saturates too
    fused[num_tokens:] = float("nan")  # padding rows
    fused[0, 4 * d] = float("nan")
    fused = fused.to(dtype)
    key = fused[:, 4 * d:(4 + kvh) * d].view(num_rows, kvh, d)
    value = fused[:, (4 + kvh) * d:].view(num_rows, kvh, d)
    slots = CACHE_WRITE_SLOTS[slot_kind](num_tokens, num_blocks, bs, g)
    kc, vc = _flash_caches(layout, num_blocks, bs, kvh, d, dtype if kv == "auto" else torch.uint8,
                           seed=6)
    for k_scale, v_scale in ((0.37, 1.9), (torch.tensor(0.37), torch.tensor(1.9))):
        written = conformance.cache_write(OPS, "reshape_and_cache_flash", key, value, kc, vc,
                                          slots, kv, k_scale, v_scale)
        kc, vc = conformance.require(written).actual  # the next write goes on top


def test_flash_cache_then_decode_round_trip(kernel):
    """Tokens appended with reshape_and_cache_flash into an HND cache (a view), then read back by
    decode: the oracle's output on the same cache."""
    inp = testing.make_decode_inputs(2, 8, 2, 64, 16, [40, 90], layout="hnd",
                                     dtype=torch.bfloat16, seed=9)
    g = torch.Generator().manual_seed(1)
    new_k = torch.randn(2, 2, 64, generator=g).to(torch.bfloat16)
    new_v = torch.randn(2, 2, 64, generator=g).to(torch.bfloat16)
    slots = [int(inp.block_tables[s, n // 16]) * 16 + n % 16 for s, n in enumerate(inp.seq_lens_list)]
    OPS.reshape_and_cache_flash(new_k, new_v, inp.key_cache, inp.value_cache, torch.tensor(slots))
    inp.seq_lens += 1
    inp.seq_lens_list = [n + 1 for n in inp.seq_lens_list]
    conformance.require(*conformance.decode(OPS, inp))


# ---- short items: a work item of at most SHORT_TOKENS tokens gathers its tokens ----

SHORT_TOKENS = 4  # csrc/cpu/kernel_common.h kShortTokens
# Row lengths whose items (512-token partitions) hold 1 .. SHORT_TOKENS + 1 tokens: whole short
# rows, and a last partition of 1 .. 5 tokens behind a full one; with block sizes 1 and 3 the
# short items cross blocks. The second set fits one partition (v2's scratch of one partition:
# the kernel writes `out` itself when it is fp32), with an empty row.
SHORT_LENS = ([1, 2, 3, 4, 5, 513, 514, 516, 517], [3, 1, 0, 4, 5, 300])
SHORT_CASES = [  # (dtype, kv_cache_dtype, num_heads, num_kv_heads, head_size, block_size, alibi)
    (torch.float32, "auto", 8, 2, 128, 16, False),
    (torch.bfloat16, "auto", 12, 2, 80, 3, True),
    (torch.float16, "auto", 4, 4, 64, 1, False),
    (torch.bfloat16, "fp8_e4m3", 6, 1, 96, 8, True),
    (torch.float32, "fp8_e5m2", 4, 2, 48, 5, False),
]


@pytest.mark.parametrize("case", SHORT_CASES,
                         ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-h{c[2]}/{c[3]}-d{c[4]}-bs{c[5]}")
def test_short_items_match_the_oracle(kernel, case):
    dtype, kv, nh, nkv, d, bs, alibi = case
    for lens in SHORT_LENS:
        check_v1_v2(testing.make_attention_inputs(len(lens), nh, nkv, d, bs, lens, dtype=dtype,
                                                  kv_cache_dtype=kv, use_alibi=alibi,
                                                  seed=d + bs + len(lens)))
    lens = SHORT_LENS[0]
    for layout in ("nhd", "hnd"):
        check_decode(testing.make_decode_inputs(len(lens), nh, nkv, d, bs, lens, layout=layout,
                                                dtype=dtype, kv_cache_dtype=kv, use_alibi=alibi,
                                                seed=d + bs))
