"""decode over NHD-ordered strided caches (CONTRACT.md "NHD / HND caches"): the oracle against
float64 dense attention, the fallback and torch.ops.paged_attn.decode against the oracle, and
decode against v1 on the same K/V.

Inputs (paged_attention_ext.tools.testing.make_decode_inputs): sharp softmax, shuffled block tables with
garbage past each row's used blocks, NaN in every unused cache slot and block (and in the storage
around strided views), outputs pre-filled with NaN, lengths 0 / 1 / around the 512-token
partitions / over 1536, every cache layout of testing.DECODE_LAYOUTS (NHD, HND as a transposed
view, combined K/V, K and V with different strides, padded strides).
"""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from support.dense_reference import dense_for_decode
from paged_attention_ext import fallback, reference
from paged_attention_ext.tools import backends, conformance, testing

# 1 token, partition edges 511/512/513, 1537 (4 partitions, 1 token in the last), empty, odd.
SEQ_LENS = [1, 511, 512, 513, 1537, 0, 37]

# (query dtype, kv_cache_dtype, (heads, kv_heads, head_size, block_size), alibi): every dtype and
# fp8 format, MHA, GQA groups 4/6/8 and MQA, block sizes 1, 16, 32 and 5 / 7 (not dividing 512).
CASES = [
    (torch.float32, "auto", (4, 4, 64, 16), False),
    (torch.float32, "auto", (8, 1, 64, 5), True),
    (torch.float16, "auto", (8, 2, 64, 1), True),
    (torch.bfloat16, "auto", (12, 2, 128, 32), False),
    (torch.bfloat16, "auto", (16, 2, 80, 16), True),
    (torch.float32, "fp8_e4m3", (16, 2, 64, 16), False),
    (torch.bfloat16, "fp8", (6, 1, 64, 32), True),
    (torch.float16, "fp8_e5m2", (8, 2, 64, 7), False),
    (torch.bfloat16, "fp8_e5m2", (12, 2, 64, 1), True),
]


def _case_id(case):
    dtype, kv, (h, kvh, d, bs), alibi = case
    return f"{str(dtype)[6:]}-{kv}-h{h}kv{kvh}d{d}bs{bs}" + ("-alibi" if alibi else "")


def _inputs(case, seed, layout, seq_lens=SEQ_LENS, **kw):
    dtype, kv, (h, kvh, d, bs), alibi = case
    return testing.make_decode_inputs(len(seq_lens), h, kvh, d, bs, seq_lens, layout=layout,
                                      dtype=dtype, kv_cache_dtype=kv, use_alibi=alibi, seed=seed,
                                      **kw)


def _layout_cases():
    """Every case, each on a different layout (and every layout on two cases), alternating a
    strided query and 0-dim tensor scales."""
    layouts = testing.DECODE_LAYOUTS
    params = []
    for index, case in enumerate(CASES):
        for layout in (layouts[index % len(layouts)], layouts[(index + 3) % len(layouts)]):
            params.append(pytest.param(index, case, layout, id=f"{_case_id(case)}-{layout}"))
    return params


def _oracle(inputs):
    return testing.call_decode(reference.decode, inputs, testing.alloc_v1_outputs(inputs))


# ---- the oracle ----

@pytest.mark.parametrize("index,case,layout", _layout_cases())
def test_oracle_matches_dense(index, case, layout):
    inputs = _inputs(case, seed=index, layout=layout, noncontig_query=index % 2 == 0,
                     scale_as_tensor=index % 3 == 0)
    got = _oracle(inputs)
    dense = dense_for_decode(inputs)  # reads the NHD views by plain indexing, in float64
    testing.assert_out_matches(got, dense.out, inputs.dtype, inputs.kv_cache_dtype)
    # the contract's promise: decode on NHD caches = v1 on v1-layout caches holding the same K/V
    v1 = testing.call_v1(reference.paged_attention_v1, inputs.legacy,
                         testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(got, v1, inputs.dtype, inputs.kv_cache_dtype, name="decode vs v1")


def test_every_layout_is_a_view_with_the_strides_it_names():
    """The layouts really differ in strides (else the tests above would test one layout)."""
    strides = {}
    for layout in testing.DECODE_LAYOUTS:
        i = _inputs(CASES[0], seed=0, layout=layout)
        assert i.key_cache.shape == i.value_cache.shape == (i.num_blocks, 16, 4, 64)
        assert i.key_cache.stride(3) == 1 and i.value_cache.stride(3) == 1
        for t in (i.key_cache, i.value_cache):  # views of the storage, no copy
            assert any(t.data_ptr() >= s.data_ptr() and
                       t.data_ptr() < s.data_ptr() + s.numel() * s.element_size()
                       for s in i.storage)
        strides[layout] = (i.key_cache.stride(), i.value_cache.stride())
    assert len(set(strides.values())) == len(testing.DECODE_LAYOUTS)
    assert strides["mixed"][0] != strides["mixed"][1]  # K and V with different strides


def test_oracle_ignores_nan_in_unused_slots():
    """Poison check: the NaN the inputs hold in unused slots, blocks and padding is there."""
    inputs = _inputs(CASES[0], seed=1, layout="padded")
    for storage in inputs.storage:
        assert storage.isnan().any()
    assert not _oracle(inputs).isnan().any()


# ---- the implementations against the oracle ----

# The CPU backends by name (tools.backends): the compiled CPU kernel and the fallback called
# directly when _C is loaded, else the fallback through torch.ops.
CPU_BACKENDS = backends.backend_names("cpu")


def _decode(backend):
    """decode of the backend named `backend`, or the oracle's ("reference")."""
    return reference.decode if backend == "reference" else backends.backend(backend).ops.decode


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("index,case,layout", _layout_cases())
def test_matches_oracle(backend, index, case, layout):
    inputs = _inputs(case, seed=index, layout=layout, noncontig_query=index % 2 == 0,
                     scale_as_tensor=index % 3 == 0)
    conformance.require(*conformance.decode(backends.backend(backend).ops, inputs))


@pytest.mark.parametrize("layout", ["nhd", "hnd", "mixed"])
def test_fallback_chunkings(layout, chunking):
    for index in (1, 7):  # block sizes 5 and 7: blocks straddle the partitions
        inputs = _inputs(CASES[index], seed=20 + index, layout=layout,
                         seq_lens=[513, 0, 1100, 37])
        conformance.require(*conformance.decode(backends.fallback_ops(), inputs))


@pytest.mark.parametrize("backend", ["reference", *CPU_BACKENDS])
@pytest.mark.parametrize("seq_lens", [[0, 0], [0], [1024], [3000, 2]],
                         ids=["all_empty", "one_empty", "full_table", "long"])
def test_edge_batches(backend, seq_lens):
    inputs = _inputs(CASES[6], seed=5, layout="combined", seq_lens=seq_lens)
    got = testing.call_decode(_decode(backend), inputs, testing.alloc_v1_outputs(inputs))
    if max(seq_lens) == 0:  # zeros, never NaN
        assert torch.equal(got, torch.zeros_like(got))
    dense = dense_for_decode(inputs)
    testing.assert_out_matches(got, dense.out, inputs.dtype, inputs.kv_cache_dtype)


def test_fallback_bad_rows_are_nan_without_checks(monkeypatch):
    # Off the CPU nothing may sync: a forbidden row is NaN (never a wild read), the others right.
    monkeypatch.setattr(fallback, "_run_data_checks", lambda device: False)
    inputs = _inputs(CASES[0], seed=4, layout="hnd", seq_lens=[40, 20, 33, 600])
    want = _oracle(inputs)
    inputs.block_tables[1, 1] = -1  # a used id out of range
    inputs.block_tables[2, 0] = inputs.num_blocks + 3
    inputs.seq_lens[3] = inputs.block_tables.shape[1] * inputs.block_size + 1  # beyond the table
    got = testing.call_decode(fallback.decode, inputs, testing.alloc_v1_outputs(inputs))
    assert got[1:].isnan().all()
    testing.assert_out_matches(got[:1], want[:1], inputs.dtype)


def test_compile_fullgraph_fallback_decode():
    """Sync-free: a graph break (host sync, data-dependent shape or branch) fails fullgraph."""
    torch._dynamo.reset()
    inputs = _inputs(CASES[6], seed=9, layout="combined_hnd", seq_lens=[513, 0, 37],
                     scale_as_tensor=True)
    compiled = SimpleNamespace(decode=torch.compile(fallback.decode, fullgraph=True,
                                                    backend="aot_eager"))
    conformance.require(*conformance.decode(compiled, inputs))


@pytest.mark.parametrize("backend", ["reference", *CPU_BACKENDS])
@pytest.mark.parametrize("dtype,kv_cache_dtype,head_size",
                         [(torch.float16, "auto", 20), (torch.float32, "fp8_e5m2", 36),
                          (torch.bfloat16, "auto", 1)])
def test_head_sizes_no_v1_cache_holds(backend, dtype, kv_cache_dtype, head_size):
    """decode has no x: any head_size (here cut from a wider cache: views with strided rows).
    The cut-off dims of the caches and the query hold NaN: a kernel whose last, partial vector of
    a row reads past head_size (masked to the vector's width, not to head_size) shows NaN."""
    wide = testing.make_decode_inputs(3, 4, 2, 48, 5, [600, 0, 13], layout="hnd", dtype=dtype,
                                      kv_cache_dtype=kv_cache_dtype, use_alibi=True, seed=8)
    for cache in (wide.key_cache, wide.value_cache):  # views: the writes reach their storage
        cache[..., head_size:] = float("nan") if cache.is_floating_point() else testing.FP8_NAN_BYTE
    wide.query[..., head_size:] = float("nan")
    inputs = dataclasses.replace(wide, query=wide.query[..., :head_size],
                                 key_cache=wide.key_cache[..., :head_size],
                                 value_cache=wide.value_cache[..., :head_size],
                                 head_size=head_size, scale=head_size ** -0.5)
    got = testing.call_decode(_decode(backend), inputs, testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(got, dense_for_decode(inputs).out, dtype, kv_cache_dtype)
