"""The reference of the reference: the oracle (paged_attention_ext.reference) against an
independent float64 dense attention (tests/dense_reference.py), on inputs built to expose bugs
(sharp softmax, shuffled tables with garbage, NaN-poisoned unused slots, NaN-filled outputs).

Run as a script (`PYTHONPATH=. python tests/test_reference.py`) to print the oracle's max error
per dtype.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from support.dense_reference import FP8_TABLES, dense_attention, dense_for
from paged_attention_ext import reference
from paged_attention_ext.core import key_chunk_elements
from paged_attention_ext.tools import conformance, testing
from paged_attention_ext.tools.testing import V2Outputs

# Lengths 1, 511/512/513 (partition edges), 1024 (2 partitions), 1537 (4 partitions, 1 token in
# the last), 0 (empty row) and an odd short one, all in one batch.
SEQ_LENS = [1, 511, 512, 513, 1024, 1537, 0, 37]

DTYPE_CASES = [  # (query dtype, kv_cache_dtype)
    (torch.float32, "auto"),
    (torch.float16, "auto"),
    (torch.bfloat16, "auto"),
    (torch.float32, "fp8_e4m3"),
    (torch.bfloat16, "fp8"),
    (torch.float32, "fp8_e5m2"),
    (torch.bfloat16, "fp8_e5m2"),
]

SHAPE_CASES = [  # (num_heads, num_kv_heads, head_size, block_size): GQA 1/4/6/8, MQA, odd blocks
    (4, 4, 64, 16),
    (8, 2, 64, 8),
    (12, 2, 128, 32),
    (8, 1, 64, 5),
    (16, 2, 80, 16),
    (3, 1, 32, 7),
]


def _dense_outputs(inputs, max_num_partitions):
    d = dense_for(inputs, max_num_partitions)
    return V2Outputs(d.out, d.exp_sums, d.max_logits, d.tmp_out)


def _check_against_dense(inputs):
    """Oracle v2 (all outputs) and v1 (out) vs float64, outputs pre-filled with NaN."""
    v2 = testing.call_v2(reference.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs))
    dense = _dense_outputs(inputs, v2.tmp_out.shape[2])
    testing.assert_v2_matches(v2, dense, inputs.seq_lens_list, inputs.dtype, inputs.kv_cache_dtype)
    v1 = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(v1, dense.out, inputs.dtype, inputs.kv_cache_dtype, name="v1 out")
    # v1 folds partitions with merge_stats, v2 combines them with partition_weights.
    testing.assert_out_matches(v1, v2.out, inputs.dtype, inputs.kv_cache_dtype, name="v1 vs v2")
    return v2, dense


@pytest.mark.parametrize("use_alibi", [False, True], ids=["no_alibi", "alibi"])
@pytest.mark.parametrize("dtype,kv_cache_dtype", DTYPE_CASES,
                         ids=[f"{str(d)[6:]}-{k}" for d, k in DTYPE_CASES])
def test_oracle_matches_dense_per_dtype(dtype, kv_cache_dtype, use_alibi):
    inputs = testing.make_attention_inputs(
        len(SEQ_LENS), 8, 2, 64, 16, SEQ_LENS, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
        use_alibi=use_alibi, seed=DTYPE_CASES.index((dtype, kv_cache_dtype)) * 2 + use_alibi,
        noncontig_query=use_alibi, scale_as_tensor=not use_alibi)
    _check_against_dense(inputs)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_size,block_size", SHAPE_CASES)
def test_oracle_matches_dense_per_shape(num_heads, num_kv_heads, head_size, block_size):
    dtype = torch.float16 if head_size == 128 else torch.float32
    inputs = testing.make_attention_inputs(
        len(SEQ_LENS), num_heads, num_kv_heads, head_size, block_size, SEQ_LENS, dtype=dtype,
        use_alibi=num_heads % 2 == 0, seed=num_heads * 100 + block_size)
    _check_against_dense(inputs)


@pytest.mark.parametrize("scale_form", ["float", "0-dim tensor", "1-element tensor"])
@pytest.mark.parametrize("noncontig_query", [False, True])
def test_scale_forms_and_query_slices(scale_form, noncontig_query):
    inputs = testing.make_attention_inputs(3, 4, 2, 32, 8, [700, 9, 64], dtype=torch.float32,
                                           kv_cache_dtype="fp8_e4m3", seed=7,
                                           noncontig_query=noncontig_query)
    if scale_form != "float":
        shape = () if scale_form == "0-dim tensor" else (1,)
        inputs.k_scale = torch.full(shape, inputs.k_scale)
        inputs.v_scale = torch.full(shape, inputs.v_scale)
    if noncontig_query:
        assert inputs.query.stride(0) > inputs.num_heads * inputs.head_size
    _check_against_dense(inputs)


def test_single_partition_rows_only():
    inputs = testing.make_attention_inputs(4, 4, 1, 64, 16, [1, 2, 300, 512], seed=3)
    v2, _ = _check_against_dense(inputs)
    assert v2.tmp_out.shape[2] == 1


def test_all_rows_empty_give_zeros():
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [0, 0], seed=4)
    v2 = testing.call_v2(reference.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs))
    v1 = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    assert torch.equal(v2.out, torch.zeros_like(v2.out))
    assert torch.equal(v1, torch.zeros_like(v1))


def test_scratch_past_a_rows_partitions_is_left_untouched():
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [600, 3], seed=5)
    v2 = testing.call_v2(reference.paged_attention_v2, inputs,
                         testing.alloc_v2_outputs(inputs, max_num_partitions=4))
    written = testing.partition_mask(inputs.seq_lens_list, 4, "cpu")  # [2, 4]
    assert not v2.exp_sums.isnan()[written[:, None, :].expand_as(v2.exp_sums)].any()
    assert v2.exp_sums.isnan()[~written[:, None, :].expand_as(v2.exp_sums)].all()
    assert v2.tmp_out[1, :, 1:].isnan().all()


def test_garbage_in_unused_slots_and_table_entries_does_not_matter():
    """Same inputs with the unused slots NaN, then huge finite values, and the garbage table
    entries changed: the outputs are bitwise equal."""
    inputs = testing.make_attention_inputs(3, 4, 2, 32, 8, [13, 520, 1], seed=6)
    first = testing.call_v2(reference.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs))
    for cache in (inputs.key_cache, inputs.value_cache):
        cache.nan_to_num_(nan=1e4)
    for s, n in enumerate(inputs.seq_lens_list):
        inputs.block_tables[s, math.ceil(n / inputs.block_size):] = 0  # a valid, foreign block
    second = testing.call_v2(reference.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs))
    assert torch.equal(first.out, second.out)


def test_kv_scales_are_ignored_for_auto_caches():
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [40, 7], seed=8)
    base = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    inputs.k_scale, inputs.v_scale = 3.0, torch.tensor(0.25)
    scaled = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    assert torch.equal(base, scaled)


def test_max_seq_len_is_only_a_hint():
    """A max_seq_len below a row's length must not drop that row's tokens."""
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [700, 30], seed=10)
    inputs.max_seq_len = 16
    _check_against_dense(inputs)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_oracle_matches_dense_random_configs(seed):
    gen = torch.Generator().manual_seed(1000 + seed)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=gen))]  # noqa
    num_kv_heads = pick([1, 2, 4])
    num_heads = num_kv_heads * pick([1, 3, 4, 8])
    dtype, kv = pick(DTYPE_CASES)
    head_size = pick([32, 64, 96, 128, 256]) if kv != "auto" else pick([32, 40, 64, 80, 128])
    num_seqs = pick([1, 3, 9])
    seq_lens = torch.randint(0, 3000, (num_seqs,), generator=gen).tolist()
    inputs = testing.make_attention_inputs(
        num_seqs, num_heads, num_kv_heads, head_size, pick([1, 3, 8, 16, 32]), seq_lens,
        dtype=dtype, kv_cache_dtype=kv, use_alibi=bool(seed % 2), seed=seed,
        noncontig_query=bool(seed % 3 == 0), scale_as_tensor=bool(seed % 4 == 1))
    _check_against_dense(inputs)


# ---- the comparison can fail: known bugs are caught ----

def _mutations(inputs):
    """(name, function V2Outputs -> V2Outputs) reproducing known paged-attention bugs."""
    seq_lens = inputs.seq_lens_list
    slopes = inputs.alibi_slopes

    def unnormalised_tmp_out(o):  # the seed's bug: tmp_out not divided by its exp sum
        return o._replace(tmp_out=o.tmp_out * o.exp_sums[..., None].nan_to_num(1.0))

    def alibi_from_first_token(o):  # slope * t instead of slope * (t - seq_len + 1)
        shift = torch.tensor([n - 1 for n in seq_lens], dtype=torch.float32)
        return o._replace(max_logits=o.max_logits + slopes[None, :, None] * shift[:, None, None])

    def last_partition_only(o):  # phase 2 dropping all but the last partition
        out = o.out.clone()
        for s, n in enumerate(seq_lens):
            if n:
                out[s] = o.tmp_out[s, :, testing.num_partitions(n) - 1]
        return o._replace(out=out)

    def out_off_by_3_atol(o):  # an error just above the tolerance
        atol, _ = testing.tolerances(inputs.dtype)
        return o._replace(out=o.out + 3 * atol)

    return [unnormalised_tmp_out, alibi_from_first_token, last_partition_only,
            out_off_by_3_atol]


@pytest.mark.parametrize("mutation_index", range(4))
def test_comparison_catches_known_bugs(mutation_index):
    inputs = testing.make_attention_inputs(3, 4, 2, 32, 16, [1030, 513, 5], seed=9,
                                           use_alibi=True)
    mutation = _mutations(inputs)[mutation_index]
    v2 = testing.call_v2(reference.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs))
    wrong = mutation(V2Outputs(*(t.clone() for t in v2)))
    dense = _dense_outputs(inputs, v2.tmp_out.shape[2])
    testing.assert_v2_matches(v2, dense, inputs.seq_lens_list, inputs.dtype)  # the real one passes
    with pytest.raises(AssertionError):
        testing.assert_v2_matches(wrong, dense, inputs.seq_lens_list, inputs.dtype)


# ---- reshape_and_cache ----

def _empty_caches(num_blocks, num_kv_heads, head_size, block_size, cache_dtype):
    x = key_chunk_elements(cache_dtype)
    fill = 0x7F if cache_dtype == torch.uint8 else float("nan")
    k = torch.full((num_blocks, num_kv_heads, head_size // x, block_size, x), fill,
                   dtype=cache_dtype)
    v = torch.full((num_blocks, num_kv_heads, head_size, block_size), fill, dtype=cache_dtype)
    return k, v


@pytest.mark.parametrize("dtype,kv_cache_dtype", [(torch.float32, "auto"), (torch.bfloat16, "auto"),
                                                  (torch.float16, "fp8_e4m3"),
                                                  (torch.float32, "fp8_e5m2")])
def test_reshape_and_cache_then_attention_matches_dense(dtype, kv_cache_dtype):
    """Write two sequences' K/V token by token into shuffled blocks (with padding slots), run the
    oracle over the cache, compare with dense attention on the K/V written (decoded)."""
    gen = torch.Generator().manual_seed(11)
    num_kv_heads, head_size, block_size, num_heads = 2, 64, 8, 4
    seq_lens = [29, 530]
    num_blocks = sum(math.ceil(n / block_size) for n in seq_lens) + 2
    kind = "auto" if kv_cache_dtype == "auto" else kv_cache_dtype
    key_cache, value_cache = _empty_caches(num_blocks, num_kv_heads, head_size, block_size,
                                           dtype if kind == "auto" else torch.uint8)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.full((2, max(math.ceil(n / block_size) for n in seq_lens) + 1), -1,
                       dtype=torch.int32)
    slots = []
    for s, n in enumerate(seq_lens):
        nb = math.ceil(n / block_size)
        ids, pool = pool[:nb], pool[nb:]
        table[s, :nb] = torch.tensor(ids, dtype=torch.int32)
        slots += [ids[t // block_size] * block_size + t % block_size for t in range(n)]
    num_tokens = len(slots)
    slot_mapping = torch.tensor(slots + [-1, -1], dtype=torch.int64)  # two padding tokens
    key = torch.randn(num_tokens + 2, num_kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(num_tokens + 2, num_kv_heads, head_size, generator=gen).to(dtype)
    key[-2:] = float("nan")  # padding tokens must never be written
    value[-2:] = float("nan")
    k_scale, v_scale = (1.0, 1.0) if kind == "auto" else (0.4, torch.tensor(1.7))
    reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                kv_cache_dtype, k_scale, v_scale)

    query = torch.randn(2, num_heads, head_size, generator=gen).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    out = torch.full_like(query, float("nan"))
    reference.paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads,
                                 head_size ** -0.5, table, lens, block_size, max(seq_lens), None,
                                 kv_cache_dtype, k_scale, v_scale)
    # Dense on a contiguous "one block per sequence" layout built straight from key/value.
    expected = dense_attention(
        query, *_dense_layout(key, value, seq_lens, kind, k_scale, v_scale),
        num_kv_heads, head_size ** -0.5,
        torch.tensor([[0], [1]], dtype=torch.int32), lens, max(seq_lens)).out
    testing.assert_out_matches(out, expected, dtype)
    # The two unused blocks are still all NaN (nothing written outside the mapped slots).
    used = set(table[table >= 0].tolist())
    for b in set(range(num_blocks)) - used:
        assert (value_cache[b] == 0x7F).all() if kind != "auto" else value_cache[b].isnan().all()


def _dense_layout(key, value, seq_lens, kind, k_scale, v_scale):
    """fp64 caches with one block of max(seq_lens) slots per sequence holding key/value as stored
    (fp8: rounded through the format by the test's own nearest-value search, times the scale)."""
    L = max(seq_lens)
    num_kv_heads, head_size = key.shape[1:]
    kc = torch.zeros(2, num_kv_heads, head_size // 2, L, 2, dtype=torch.float64)  # x = 2
    vc = torch.zeros(2, num_kv_heads, head_size, L, dtype=torch.float64)
    start = 0
    for s, n in enumerate(seq_lens):
        k, v = key[start:start + n].double(), value[start:start + n].double()
        if kind != "auto":
            k = _nearest_fp8(k / float(k_scale), kind) * float(k_scale)
            v = _nearest_fp8(v / float(v_scale), kind) * float(v_scale)
        kc[s, :, :, :n, :] = k.reshape(n, num_kv_heads, head_size // 2, 2).permute(1, 2, 0, 3)
        vc[s, :, :, :n] = v.permute(1, 2, 0)
        start += n
    return kc, vc


def _nearest_fp8(x, kind):
    """x (float64) -> the nearest finite fp8 value, saturating (ties: any nearest value)."""
    table = FP8_TABLES[kind]
    finite = table[torch.isfinite(table)]
    idx = (x.reshape(-1, 1) - finite.reshape(1, -1)).abs().argmin(dim=1)
    return finite[idx].reshape(x.shape)


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_reshape_and_cache_fp8_rounds_to_nearest_and_saturates(kv_cache_dtype):
    gen = torch.Generator().manual_seed(12)
    key_cache, value_cache = _empty_caches(2, 1, 16, 4, torch.uint8)
    fmax = float(FP8_TABLES[kv_cache_dtype][torch.isfinite(FP8_TABLES[kv_cache_dtype])].max())
    key = torch.randn(3, 1, 16, generator=gen) * 100
    key[0, 0, :4] = torch.tensor([1e9, -1e9, float("inf"), -float("inf")])
    value = torch.randn(3, 1, 16, generator=gen)
    slot_mapping = torch.tensor([5, -1, 2], dtype=torch.int64)
    scale = 0.5
    reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                kv_cache_dtype, scale, scale)
    decoded = FP8_TABLES[kv_cache_dtype][key_cache[1, 0, 0, 1, :].long()]  # slot 5: block 1, off 1
    assert decoded[:4].tolist() == [fmax, -fmax, fmax, -fmax]
    nearest = _nearest_fp8(key[0, 0].double() / scale, kv_cache_dtype)
    # Round to nearest: the stored value is as close to x/scale as the nearest representable one.
    x = key[0, 0].double() / scale
    assert ((decoded - x).abs() <= (nearest - x).abs() + 1e-12)[4:].all()
    # Token 1 (slot -1) wrote nothing: only slots 5 and 2 hold non-NaN bytes.
    written = (value_cache != 0x7F).any(dim=2)  # [num_blocks, heads, block_size]
    assert written.nonzero().tolist() == [[0, 0, 2], [1, 0, 1]]


def test_reshape_and_cache_auto_is_exact_and_skips_padding():
    key_cache, value_cache = _empty_caches(3, 2, 32, 4, torch.float16)
    key = torch.randn(4, 2, 32).half()
    value = torch.randn(4, 2, 32).half()
    slot_mapping = torch.tensor([11, -1, 0, 6], dtype=torch.int64)
    reference.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, "auto", 2.0, 2.0)
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        b, o = divmod(slot, 4)
        assert torch.equal(key_cache[b, :, :, o, :].reshape(2, 32), key[i])  # scale ignored
        assert torch.equal(value_cache[b, :, :, o], value[i])
    assert value_cache.isnan().any(dim=2).sum() == 3 * 2 * 4 - 3 * 2


# ---- the numbers for the report ----

def max_errors():
    """{(dtype, kv_cache_dtype): (max |out - fp64|, max |tmp_out - fp64|)} on SEQ_LENS."""
    result = {}
    for dtype, kv in DTYPE_CASES:
        inputs = testing.make_attention_inputs(len(SEQ_LENS), 8, 2, 64, 16, SEQ_LENS, dtype=dtype,
                                               kv_cache_dtype=kv, use_alibi=True, seed=1)
        v2 = testing.call_v2(reference.paged_attention_v2, inputs,
                             testing.alloc_v2_outputs(inputs))
        dense = _dense_outputs(inputs, v2.tmp_out.shape[2])
        mask = testing.partition_mask(SEQ_LENS, v2.tmp_out.shape[2], "cpu")[:, None, :]
        mask = mask.expand(-1, inputs.num_heads, -1)
        out_err = (v2.out.double() - dense.out).abs().max().item()
        tmp_err = (v2.tmp_out[mask].double() - dense.tmp_out[mask]).abs().max().item()
        result[(dtype, kv)] = (out_err, tmp_err)
    return result


def test_max_errors_within_tolerance():
    for (dtype, kv), (out_err, tmp_err) in max_errors().items():
        atol, _ = testing.tolerances(dtype, kv)
        print(f"{str(dtype):16s} {kv:9s} out {out_err:.3e} tmp_out {tmp_err:.3e} atol {atol:.1e}")
        assert out_err < atol and tmp_err < atol, (dtype, kv)


if __name__ == "__main__":
    print("oracle vs float64 dense, max abs error (8 rows, lengths", SEQ_LENS, ")")
    for (dtype, kv), (out_err, tmp_err) in max_errors().items():
        print(f"  {str(dtype):16s} {kv:9s} out {out_err:.3e}  tmp_out {tmp_err:.3e}"
              f"  (atol {testing.tolerances(dtype, kv)[0]:.1e})")


ORACLE = SimpleNamespace(v1=reference.paged_attention_v1, decode=reference.decode)
@pytest.mark.parametrize("kv,side,layout", conformance.EVERY_BYTE_CASES,
                         ids=["-".join(c) for c in conformance.EVERY_BYTE_CASES])
def test_every_fp8_byte_gives_the_defined_out(kv, side, layout):
    """The every-byte inputs (testing.every_fp8_byte_inputs) define their out in closed form from
    torch's fp8 decode; the oracle meets it, so those tests' premise holds."""
    conformance.require(conformance.every_fp8_byte(ORACLE, kv, side, layout))
