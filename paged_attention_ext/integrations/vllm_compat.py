"""Drop-in functions with vLLM's `_custom_ops` names and the seed's exact Python signature, each a
call of `torch.ops.paged_attn.*` (whichever backend is active for the tensors' device).

A vLLM (or fork) whose `_custom_ops.paged_attention_v1 / v2 / reshape_and_cache` are missing or
raise NotImplementedError gets these functions from the package's vLLM plugin
(`integrations/vllm_plugin.py`, loaded by vLLM in each of its processes), with no edit to vLLM.
Code that is not vLLM calls them directly:

    from paged_attention_ext.integrations.vllm_compat import (
        paged_attention_v1, paged_attention_v2, reshape_and_cache)

or, keeping its own function: `return paged_attention_v2_pytorch(out, exp_sum, ...)`.

k_scale / v_scale may be Python floats (the seed) or 1-element float32 tensors (current vLLM);
the ops pick the matching overload. Unlike the seed, the output is correct for every length
(the seed combined unnormalised partition sums as if normalised: docs/CONTRACT.md).
"""

from typing import Optional, Union

import torch  # importing this module imports the package, which registers torch.ops.paged_attn

Scale = Union[float, torch.Tensor]


def paged_attention_v2_pytorch(
    output: torch.Tensor,  # [num_seqs, num_heads, head_size]
    exp_sums: torch.Tensor,  # float32 [num_seqs, num_heads, max_num_partitions]
    max_logits: torch.Tensor,  # float32 [num_seqs, num_heads, max_num_partitions]
    tmp_output: torch.Tensor,  # [num_seqs, num_heads, max_num_partitions, head_size]
    query: torch.Tensor,  # [num_seqs, num_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, num_kv_heads, head_size/x, block_size, x]
    value_cache: torch.Tensor,  # [num_blocks, num_kv_heads, head_size, block_size]
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor,  # int32 [num_seqs]
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],  # float32 [num_heads] or None
    kv_cache_dtype: str = "auto",
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    """The seed's function, computed by torch.ops.paged_attn.v2 (writes output and scratch)."""
    torch.ops.paged_attn.v2(
        output, exp_sums, max_logits, tmp_output, query, key_cache, value_cache, num_kv_heads,
        scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
        k_scale, v_scale, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
        blocksparse_block_size, blocksparse_head_sliding_step)


paged_attention_v2 = paged_attention_v2_pytorch  # vLLM's _custom_ops name


def paged_attention_v1(
    out: torch.Tensor,  # [num_seqs, num_heads, head_size]
    query: torch.Tensor,  # [num_seqs, num_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, num_kv_heads, head_size/x, block_size, x]
    value_cache: torch.Tensor,  # [num_blocks, num_kv_heads, head_size, block_size]
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor,  # int32 [num_seqs]
    block_size: int,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],  # float32 [num_heads] or None
    kv_cache_dtype: str = "auto",
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    """vLLM's _custom_ops.paged_attention_v1, computed by torch.ops.paged_attn.v1."""
    torch.ops.paged_attn.v1(
        out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
        block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank,
        blocksparse_local_blocks, blocksparse_vert_stride, blocksparse_block_size,
        blocksparse_head_sliding_step)


def reshape_and_cache(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, num_kv_heads, head_size/x, block_size, x]
    value_cache: torch.Tensor,  # [num_blocks, num_kv_heads, head_size, block_size]
    slot_mapping: torch.Tensor,  # int64 [num_tokens]; negative = padding, skipped
    kv_cache_dtype: str = "auto",
    k_scale: Scale = 1.0,
    v_scale: Scale = 1.0,
) -> None:
    """vLLM's _custom_ops.reshape_and_cache, computed by torch.ops.paged_attn.reshape_and_cache."""
    torch.ops.paged_attn.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                           kv_cache_dtype, k_scale, v_scale)
