"""The pure math every PyTorch implementation shares, mirroring csrc/core (framework-free there,
torch ops here): the compound softmax state (compound_state.h), the fp8 cache codec (fp8.h),
and the contract's constants and cache kinds (params.h), owned here for all of Python.

The oracle (reference.py) and the fallback (fallback.py) both import this module and nothing
from each other: the judge does not share code with what it judges beyond these few functions,
which tests/test_reference.py proves through the oracle against float64 dense attention.
"""

import torch

from .schemas import KV_CACHE_DTYPES  # kv_cache_dtype -> cache kind, the one table

_NEG_INF = float("-inf")

# ---- csrc/core/params.h: the contract's constants (tests/test_core_constants.py ties them) ----

PARTITION_SIZE = 512  # v2 partition length in tokens (kPartitionSize)

# fp8 cache kind -> the torch dtype its uint8 bytes are viewed as.
FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def cache_kind(kv_cache_dtype, where):
    """kv_cache_dtype -> cache kind ("auto", "fp8_e4m3" or "fp8_e5m2"); anything else is a
    ValueError "<where>: unknown kv_cache_dtype ..."."""
    kind = KV_CACHE_DTYPES.get(kv_cache_dtype) if isinstance(kv_cache_dtype, str) else None
    if kind is None:
        names = [f"'{name}'" for name in KV_CACHE_DTYPES]
        raise ValueError(f"{where}: unknown kv_cache_dtype '{kv_cache_dtype}' "
                         f"(expected {', '.join(names[:-1])} or {names[-1]})")
    return kind


def cache_storage_dtype(kind, model_dtype):
    """The element dtype of a cache of this kind: the model (query) dtype for "auto", uint8
    bytes for fp8."""
    return model_dtype if kind == "auto" else torch.uint8


def key_chunk_elements(cache_dtype):
    """x: the elements of one 16-byte chunk of a cache of element dtype `cache_dtype` (vLLM's
    key_cache [num_blocks, num_kv_heads, head_size / x, block_size, x]; params.h `x`)."""
    return 16 // cache_dtype.itemsize


# ---- csrc/core/compound_state.h, vectorised over leading dims (mirror it line for line) ----

def merge_stats(a_max, a_sum, b_max, b_sum):
    """Merge two (max, sum) summaries. Returns (max, sum, scale_a, scale_b) with
    merged.out = a.out * scale_a + b.out * scale_b. Both empty (max -inf) stays empty."""
    m = torch.maximum(a_max, b_max)
    both_empty = m == _NEG_INF  # both empty: stay empty, never exp(NaN)
    scale_a = torch.where(both_empty, 0.0, torch.exp(a_max - m))  # exp(-inf) = 0 for an empty side
    scale_b = torch.where(both_empty, 0.0, torch.exp(b_max - m))
    merged_max = torch.where(both_empty, _NEG_INF, m)
    merged_sum = torch.where(both_empty, 0.0, a_sum * scale_a + b_sum * scale_b)
    return merged_max, merged_sum, scale_a, scale_b


def inv_sum(s_sum):
    """1 / sum for normalising an output; 0 for the empty set (seq_len 0 gives zeros, not NaN)."""
    return torch.where(s_sum > 0.0, 1.0 / s_sum, 0.0)


def partition_weights(max_logits, exp_sums):
    """Phase 2 weights. max_logits, exp_sums [..., n] (partition p holds its max m_p, its exp sum
    s_p, and its output normalised by s_p). Returns w [..., n]:
    w_p = s_p * exp(m_p - M) / sum_q s_q * exp(m_q - M), M = max_p m_p; all-empty gives zeros."""
    m = max_logits.amax(dim=-1, keepdim=True)
    w = torch.where(m == _NEG_INF, 0.0, exp_sums * torch.exp(max_logits - m))
    total = w.sum(dim=-1, keepdim=True)
    inv = torch.where(total > 0.0, 1.0 / total, 0.0)
    return w * inv


# ---- cache decoding / encoding ----

def scale_value(s, device):
    """k_scale / v_scale as passed (float or 1-element tensor) -> something to multiply by."""
    return s.to(device=device, dtype=torch.float32).reshape(()) if isinstance(s, torch.Tensor) else float(s)


def decode_cache(t, kind, scale):
    """Cache elements -> fp32 values: 'auto' as is (scale ignored), fp8 bytes decoded * scale."""
    if kind == "auto":
        return t.float()
    return t.view(FP8_DTYPES[kind]).float() * scale


def encode_cache(t, kind, scale):
    """Values -> cache elements: 'auto' as is, fp8: fp8(x / scale) saturated to the finite max.
    NOTE: torch's float8 conversion does not saturate (overflow gives NaN / inf), so clamp first."""
    if kind == "auto":
        return t
    fp8 = FP8_DTYPES[kind]
    fmax = torch.finfo(fp8).max
    return (t.float() / scale).clamp(-fmax, fmax).to(fp8).view(torch.uint8)
