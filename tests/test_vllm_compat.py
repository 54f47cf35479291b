"""paged_attention_ext.integrations.vllm_compat: the seed's signature and vLLM's _custom_ops names, called
exactly as the seed / vLLM call them, against the oracle (paged_attention_ext.reference)."""

import inspect

import pytest
import torch

from paged_attention_ext import reference
from paged_attention_ext.core import key_chunk_elements
from paged_attention_ext.tools import testing
from paged_attention_ext.integrations import vllm_compat

# The signature of the PyTorch reference function vLLM ports call (paged_attention_v2_pytorch):
# names, order, defaults.
SEED_PARAMETERS = [
    ("output", inspect.Parameter.empty), ("exp_sums", inspect.Parameter.empty),
    ("max_logits", inspect.Parameter.empty), ("tmp_output", inspect.Parameter.empty),
    ("query", inspect.Parameter.empty), ("key_cache", inspect.Parameter.empty),
    ("value_cache", inspect.Parameter.empty), ("num_kv_heads", inspect.Parameter.empty),
    ("scale", inspect.Parameter.empty), ("block_tables", inspect.Parameter.empty),
    ("seq_lens", inspect.Parameter.empty), ("block_size", inspect.Parameter.empty),
    ("max_seq_len", inspect.Parameter.empty), ("alibi_slopes", inspect.Parameter.empty),
    ("kv_cache_dtype", "auto"), ("k_scale", 1.0), ("v_scale", 1.0), ("tp_rank", 0),
    ("blocksparse_local_blocks", 0), ("blocksparse_vert_stride", 0),
    ("blocksparse_block_size", 64), ("blocksparse_head_sliding_step", 0),
]


def _parameters(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_match_the_seed_and_vllm():
    assert _parameters(vllm_compat.paged_attention_v2_pytorch) == SEED_PARAMETERS
    # vLLM's _custom_ops.paged_attention_v2: out, exp_sum, max_logits, tmp_out, then the same.
    assert _parameters(vllm_compat.paged_attention_v2) == [
        ("out", inspect.Parameter.empty), ("exp_sum", inspect.Parameter.empty),
        ("max_logits", inspect.Parameter.empty), ("tmp_out", inspect.Parameter.empty)] + \
        SEED_PARAMETERS[4:]
    # v1: the same without the three v2 scratch tensors, and the output named `out` as in vLLM.
    assert _parameters(vllm_compat.paged_attention_v1) == [("out", inspect.Parameter.empty)] + \
        SEED_PARAMETERS[4:]
    for write in (vllm_compat.reshape_and_cache, vllm_compat.reshape_and_cache_flash):
        assert [name for name, _ in _parameters(write)] == [
            "key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype",
            "k_scale", "v_scale"]


@pytest.mark.parametrize("dtype,use_alibi,num_heads,num_kv_heads,seq_lens", [
    (torch.float32, False, 8, 2, [1, 37, 513, 1100]),
    (torch.bfloat16, True, 12, 2, [700, 5, 1024]),
    (torch.float16, False, 4, 4, [16, 600]),
])
def test_seed_call_matches_oracle(paged_ops, dtype, use_alibi, num_heads, num_kv_heads, seq_lens):
    """The seed's own call: 14 positional arguments, the rest left at their defaults."""
    inputs = testing.make_attention_inputs(len(seq_lens), num_heads, num_kv_heads, 64, 16,
                                           seq_lens, dtype=dtype, use_alibi=use_alibi, seed=5)
    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs))
    output, exp_sums, max_logits, tmp_output = actual = testing.alloc_v2_outputs(inputs)
    i = inputs
    result = vllm_compat.paged_attention_v2_pytorch(
        output, exp_sums, max_logits, tmp_output, i.query, i.key_cache, i.value_cache,
        i.num_kv_heads, i.scale, i.block_tables, i.seq_lens, i.block_size, i.max_seq_len,
        i.alibi_slopes)
    assert result is None
    testing.assert_v2_matches(actual, expected, seq_lens, dtype)


@pytest.mark.parametrize("kv_cache_dtype,scale_as_tensor", [("auto", False), ("fp8", True),
                                                            ("fp8_e5m2", False)])
def test_vllm_positional_calls_match_oracle(paged_ops, kv_cache_dtype, scale_as_tensor):
    """vLLM's call (PagedAttention.forward_decode): every argument positional, k_scale / v_scale
    as float32 tensors in current vLLM."""
    seq_lens = [3, 530, 77]
    inputs = testing.make_attention_inputs(3, 6, 2, 32, 8, seq_lens, dtype=torch.float16,
                                           kv_cache_dtype=kv_cache_dtype, seed=11,
                                           noncontig_query=True, scale_as_tensor=scale_as_tensor)
    i = inputs
    tail = (i.query, i.key_cache, i.value_cache, i.num_kv_heads, i.scale, i.block_tables,
            i.seq_lens, i.block_size, i.max_seq_len, i.alibi_slopes, i.kv_cache_dtype, i.k_scale,
            i.v_scale, 0, 0, 0, 64, 0)

    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs))
    actual = testing.alloc_v2_outputs(inputs)
    vllm_compat.paged_attention_v2(*actual, *tail)
    testing.assert_v2_matches(actual, expected, seq_lens, torch.float16, kv_cache_dtype)

    expected_v1 = testing.call_v1(reference.paged_attention_v1, inputs,
                                  testing.alloc_v1_outputs(inputs))
    out = testing.alloc_v1_outputs(inputs)
    vllm_compat.paged_attention_v1(out, *tail)
    testing.assert_out_matches(out, expected_v1, torch.float16, kv_cache_dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_reshape_and_cache_matches_oracle(paged_ops, kv_cache_dtype):
    gen = torch.Generator().manual_seed(3)
    num_tokens, num_kv_heads, head_size, block_size, num_blocks = 13, 2, 32, 4, 9
    key = torch.randn(num_tokens, num_kv_heads, head_size, generator=gen).to(torch.bfloat16)
    value = torch.randn(num_tokens, num_kv_heads, head_size, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 7]] = -1  # padding tokens: skipped
    storage = torch.bfloat16 if kv_cache_dtype == "auto" else torch.uint8
    x = key_chunk_elements(storage)
    fill = float("nan") if kv_cache_dtype == "auto" else testing.FP8_NAN_BYTE
    key_cache = torch.full((num_blocks, num_kv_heads, head_size // x, block_size, x), fill,
                           dtype=storage)
    value_cache = torch.full((num_blocks, num_kv_heads, head_size, block_size), fill,
                             dtype=storage)
    k_scale, v_scale = (1.0, 1.0) if kv_cache_dtype == "auto" else (0.5, 2.0)

    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    reference.reshape_and_cache(key, value, expected_k, expected_v, slots, kv_cache_dtype,
                                k_scale, v_scale)
    vllm_compat.reshape_and_cache(key, value, key_cache, value_cache, slots, kv_cache_dtype,
                                  k_scale, v_scale)
    # Bitwise: the same values are written to the same slots, and nothing else is touched.
    assert torch.equal(key_cache.view(torch.uint8), expected_k.view(torch.uint8))
    assert torch.equal(value_cache.view(torch.uint8), expected_v.view(torch.uint8))
    written = key_cache.view(torch.uint8) != torch.full_like(key_cache, fill).view(torch.uint8)
    assert written.any()  # the call wrote something


def test_vllm_keyword_calls_match_oracle(paged_ops):
    """vLLM's argument names by keyword (out, exp_sum, max_logits, tmp_out, ...): the functions
    the plugin installs take what vLLM's _custom_ops take."""
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [530, 9], dtype=torch.bfloat16,
                                           seed=12)
    i = inputs
    common = dict(query=i.query, key_cache=i.key_cache, value_cache=i.value_cache,
                  num_kv_heads=i.num_kv_heads, scale=i.scale, block_tables=i.block_tables,
                  seq_lens=i.seq_lens, block_size=i.block_size, max_seq_len=i.max_seq_len,
                  alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0)
    expected = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs))
    out, exp_sum, max_logits, tmp_out = actual = testing.alloc_v2_outputs(inputs)
    vllm_compat.paged_attention_v2(out=out, exp_sum=exp_sum, max_logits=max_logits,
                                   tmp_out=tmp_out, **common)
    testing.assert_v2_matches(actual, expected, i.seq_lens_list, torch.bfloat16)
    out_v1 = testing.alloc_v1_outputs(inputs)
    vllm_compat.paged_attention_v1(out=out_v1, **common)
    testing.assert_out_matches(out_v1, expected.out, torch.bfloat16)
