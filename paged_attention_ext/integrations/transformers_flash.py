"""FlashAttention's Python API (the subset transformers calls) over this project's ops.

transformers drives a "flash" attention implementation through three functions with
FlashAttention's signatures (`modeling_flash_attention_utils._flash_attention_forward`):
  flash_attn_with_kvcache  decode-only continuous-batching steps: one new token per sequence,
                           K/V written into transformers' paged cache and attended there.
                           Runs `torch.ops.paged_attn.reshape_and_cache_flash` then
                           `torch.ops.paged_attn.decode` on the cache tensors as they are
                           ([num_pages, page_size, num_kv_heads, head_size] views of transformers'
                           one cache buffer: never copied, never permuted).
  flash_attn_varlen_func   prefill and mixed continuous-batching steps (several sequences packed
                           along the token axis, K/V already gathered by transformers), and
                           padded batches of generate().
  flash_attn_func          generate() without padding.
The last two compute causal attention per sequence with torch's scaled_dot_product_attention.

Causal masks are aligned bottom-right as in FlashAttention >= 2.1: query i of a sequence with
q_len queries and k_len keys sees keys j <= i + k_len - q_len; a sliding window (window_size)
narrows that by FlashAttention's rule. flash_attn_with_kvcache has no window (paged_attn.decode
attends to the whole sequence; transformers never sends sliding-window models down that path).

Arguments these functions do not compute (dropout, attention sinks, a window in
flash_attn_with_kvcache) are in the signatures on purpose: transformers drops a feature the
signature lacks instead of refusing it, so each is accepted here only at its neutral value and
refused otherwise (softcap is left out: transformers itself refuses it for functions without
the argument).
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

_NAME = "paged_attention_ext flash API"


def _refuse_unsupported(function: str, dropout_p: float, s_aux) -> None:
    problem = None
    if dropout_p:
        problem = f"dropout (dropout_p={dropout_p}); inference only"
    elif s_aux is not None:
        problem = "attention sinks (s_aux)"
    if problem:
        raise ValueError(f"{_NAME}: {function} does not support {problem}")


def _causal_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      scale: Optional[float], causal: bool,
                      window_size: Tuple[int, int]) -> torch.Tensor:
    """One sequence. query [q_len, num_heads, d]; key, value [k_len, num_kv_heads, d]
    -> [q_len, num_heads, d]. Query i stands at key position i + k_len - q_len (bottom-right);
    it sees key j when j <= that position (causal) and, for window_size (left, right) entries
    >= 0, when j >= position - left and j <= position + right (FlashAttention's rule)."""
    q_len, k_len = query.shape[0], key.shape[0]
    left, right = window_size
    right = 0 if causal else right
    mask, is_causal = None, False
    if left < 0 and right == 0 and q_len == k_len:
        is_causal = True  # sdpa's own mask: top-left aligned, the same when q_len == k_len
    elif (left >= 0 or right >= 0) and not (left < 0 and right == 0 and q_len == 1):
        # (a single causal query without a window sees every key: no mask)
        position = torch.arange(q_len, device=query.device)[:, None] + (k_len - q_len)
        j = torch.arange(k_len, device=query.device)[None, :]
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device)
        if right >= 0:
            mask &= j <= position + right
        if left >= 0:
            mask &= j >= position - left
    out = F.scaled_dot_product_attention(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), attn_mask=mask,
        is_causal=is_causal, scale=scale, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(0, 1)


def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: Optional[int] = None, max_seqlen_k: Optional[int] = None,
                           dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                           causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                           s_aux: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Packed sequences. q [total_q, num_heads, d]; k, v [total_k, num_kv_heads, d];
    cu_seqlens_q / cu_seqlens_k int [num_seqs + 1]: sequence i is rows cu[i]:cu[i + 1].
    Returns [total_q, num_heads, d]; rows past cu_seqlens_q[-1] (padding) are zero."""
    _refuse_unsupported("flash_attn_varlen_func", dropout_p, s_aux)
    out = q.new_zeros(q.shape)
    starts_q, starts_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()  # host: loop bounds
    for i in range(len(starts_q) - 1):
        q0, q1, k0, k1 = starts_q[i], starts_q[i + 1], starts_k[i], starts_k[i + 1]
        if q1 > q0:
            out[q0:q1] = _causal_attention(q[q0:q1], k[k0:k1], v[k0:k1], softmax_scale, causal,
                                           window_size)
    return out


def flash_attn_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    softmax_scale: Optional[float] = None, causal: bool = False,
                    window_size: Tuple[int, int] = (-1, -1),
                    s_aux: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q [batch, q_len, num_heads, d]; k, v [batch, k_len, num_kv_heads, d] -> like q."""
    _refuse_unsupported("flash_attn_func", dropout_p, s_aux)
    return torch.stack([_causal_attention(q[b], k[b], v[b], softmax_scale, causal, window_size)
                        for b in range(q.shape[0])])


def flash_attn_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                            cache_seqlens: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None,
                            softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Tuple[int, int] = (-1, -1),
                            s_aux: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Decode over a paged cache, appending the new token first (FlashAttention's contract).

    q [num_seqs, 1, num_heads, d]; k, v [num_seqs, 1, num_kv_heads, d]: the new token.
    k_cache, v_cache [num_pages, page_size, num_kv_heads, d], last dim contiguous (any other
    strides). block_table int32 [num_seqs, max_pages]: page ids, unused entries ignored.
    cache_seqlens int [num_seqs]: tokens already cached; the new token goes to that position
    and attends over cache_seqlens + 1 tokens. A negative entry marks a padding sequence:
    nothing written, zero output. Returns [num_seqs, 1, num_heads, d].
    """
    _refuse_unsupported("flash_attn_with_kvcache", 0.0, s_aux)
    if tuple(window_size) != (-1, -1):  # paged_attn.decode attends to the whole sequence
        raise ValueError(f"{_NAME}: flash_attn_with_kvcache does not support a sliding window "
                         f"(window_size={tuple(window_size)})")
    if block_table is None or cache_seqlens is None or k is None or v is None:
        raise ValueError(f"{_NAME}: flash_attn_with_kvcache computes the paged decode step "
                         "only: it needs block_table, cache_seqlens and the new k, v")
    if q.dim() != 4 or q.shape[1] != 1 or k.shape[1] != 1 or v.shape[1] != 1:
        raise ValueError(f"{_NAME}: flash_attn_with_kvcache takes one new token per sequence "
                         f"(q {tuple(q.shape)}, k {tuple(k.shape)})")
    # Rows past the shortest of q, cache_seqlens and block_table are padding (zero output).
    num_seqs = min(q.shape[0], cache_seqlens.shape[0], block_table.shape[0])
    page_size = k_cache.shape[1]
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale

    # The new token's slot: page block_table[i, pos // page_size], offset pos % page_size.
    positions = cache_seqlens[:num_seqs].long()  # [num_seqs]
    valid = positions >= 0
    safe_positions = positions.clamp(min=0)
    pages = block_table[:num_seqs].gather(1, (safe_positions // page_size)[:, None])[:, 0].long()
    slot_mapping = torch.where(valid, pages * page_size + safe_positions % page_size, -1)
    # .default named: float scales (the packet would resolve to it, one Python step later)
    torch.ops.paged_attn.reshape_and_cache_flash.default(k[:num_seqs, 0], v[:num_seqs, 0],
                                                         k_cache, v_cache, slot_mapping)

    seq_lens = torch.where(valid, positions + 1, 0).to(torch.int32)
    query = q[:num_seqs, 0]  # [num_seqs, num_heads, d]
    if query.stride(-1) != 1:
        query = query.contiguous()
    out = q.new_zeros(q.shape[0], *q.shape[2:])  # [all rows, num_heads, d]
    torch.ops.paged_attn.decode.default(out[:num_seqs], query, k_cache, v_cache,
                                        block_table[:num_seqs].int(), seq_lens, scale, None)
    return out[:, None]
