"""An independent float64 dense attention: the reference of the reference.

Written without the oracle's code: tokens are gathered by plain indexing of (block, slot) pairs,
fp8 bytes are decoded by a bit-level table built here (not torch's float8 dtypes), and the
softmax is the textbook one in float64. Also returns the per-partition statistics a v2 kernel
must produce, so the oracle's scratch outputs are checked too.

An optional boolean mask [num_seqs, num_heads, >= max seq_len] says which tokens each head
attends (blocksparse: the caller builds it from the definition); the others are not even read.
A head with no attended token outputs zeros; a partition with none is empty (max -inf, exp sum 0,
output 0).
"""

import math
from typing import NamedTuple

import torch

PARTITION = 512


def _fp8_table(exp_bits, man_bits, bias, ieee_specials):
    """float64 [256]: the value of every fp8 byte. e4m3fn: only S.1111.111 is NaN (no inf);
    e5m2 (IEEE-like): exponent all ones is inf (mantissa 0) or NaN."""
    values = []
    for byte in range(256):
        sign = -1.0 if byte & 0x80 else 1.0
        e = (byte >> man_bits) & ((1 << exp_bits) - 1)
        m = byte & ((1 << man_bits) - 1)
        top = (1 << exp_bits) - 1
        if ieee_specials and e == top:
            values.append(sign * math.inf if m == 0 else math.nan)
        elif not ieee_specials and e == top and m == (1 << man_bits) - 1:
            values.append(math.nan)
        elif e == 0:  # subnormal
            values.append(sign * (m / (1 << man_bits)) * 2.0 ** (1 - bias))
        else:
            values.append(sign * (1 + m / (1 << man_bits)) * 2.0 ** (e - bias))
    return torch.tensor(values, dtype=torch.float64)


FP8_TABLES = {
    "fp8": _fp8_table(4, 3, 7, ieee_specials=False),
    "fp8_e4m3": _fp8_table(4, 3, 7, ieee_specials=False),
    "fp8_e5m2": _fp8_table(5, 2, 15, ieee_specials=True),
}


class DenseResult(NamedTuple):
    out: torch.Tensor  # float64 [num_seqs, num_heads, head_size]
    max_logits: torch.Tensor  # float64 [num_seqs, num_heads, P]; NaN past a row's partitions
    exp_sums: torch.Tensor  # float64 [num_seqs, num_heads, P]
    tmp_out: torch.Tensor  # float64 [num_seqs, num_heads, P, head_size] (normalised per partition)


def _to_f64(cache, kv_cache_dtype, scale):
    if kv_cache_dtype == "auto":
        return cache.double()
    return FP8_TABLES[kv_cache_dtype][cache.long()] * float(scale)


def dense_attention(query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                    block_size, alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0,
                    v_scale=1.0, num_partitions=None, mask=None, cache_layout="v1"):
    """float64 paged attention, on the CPU. Returns DenseResult (P = num_partitions, default the
    longest row's partition count, at least 1). mask: see the module docstring. cache_layout:
    "v1" (key_cache [nb, kvh, d/x, bs, x], value_cache [nb, kvh, d, bs]) or "nhd" (both
    [nb, bs, kvh, d], any strides)."""
    query, key_cache, value_cache = query.cpu(), key_cache.cpu(), value_cache.cpu()
    block_tables, lens = block_tables.cpu(), [int(n) for n in seq_lens.cpu()]
    num_seqs, num_heads, head_size = query.shape
    per_kv = num_heads // num_kv_heads
    P = num_partitions or max(1, max((math.ceil(n / PARTITION) for n in lens), default=1))
    nan = float("nan")
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    max_logits = torch.full((num_seqs, num_heads, P), nan, dtype=torch.float64)
    exp_sums = torch.full((num_seqs, num_heads, P), nan, dtype=torch.float64)
    tmp_out = torch.full((num_seqs, num_heads, P, head_size), nan, dtype=torch.float64)

    for s, n in enumerate(lens):
        if n == 0:
            continue
        t = torch.arange(n)
        blocks = block_tables[s, t // block_size].long()  # [n]
        slots = t % block_size
        if cache_layout == "nhd":  # cache[b, slot] is token (b, slot): [kvh, d]
            k, v = key_cache[blocks, slots], value_cache[blocks, slots]  # [n, kvh, d]
        else:
            # key_cache[b, h, i, slot, j] holds element i * x + j of the key of token (b, slot).
            k = key_cache[blocks, :, :, slots, :].reshape(n, num_kv_heads, head_size)
            v = value_cache[blocks, :, :, slots]  # [n, kvh, d]
        k = _to_f64(k, kv_cache_dtype, k_scale)
        v = _to_f64(v, kv_cache_dtype, v_scale)
        for h in range(num_heads):
            kv_h = h // per_kv
            attended = torch.ones(n, dtype=torch.bool) if mask is None else mask[s, h, :n].cpu()
            logits = scale * (k[:, kv_h, :] @ query[s, h].double())  # [n]
            if alibi_slopes is not None:
                logits = logits + float(alibi_slopes[h]) * (t.double() - (n - 1))
            if attended.any():  # else zeros
                p = torch.softmax(logits[attended], dim=0)
                out[s, h] = p @ v[attended, kv_h, :]
            for part in range(math.ceil(n / PARTITION)):
                lo, hi = part * PARTITION, min(n, (part + 1) * PARTITION)
                sel = attended[lo:hi]
                if not sel.any():  # an empty partition
                    max_logits[s, h, part], exp_sums[s, h, part] = -math.inf, 0.0
                    tmp_out[s, h, part] = 0.0
                    continue
                m = logits[lo:hi][sel].max()
                e = torch.exp(logits[lo:hi][sel] - m)
                max_logits[s, h, part] = m
                exp_sums[s, h, part] = e.sum()
                tmp_out[s, h, part] = (e @ v[lo:hi, kv_h, :][sel]) / e.sum()
    return DenseResult(out, max_logits, exp_sums, tmp_out)


def dense_for(inputs, num_partitions=None, mask=None):
    """dense_attention on a paged_attention_ext.tools.testing.AttentionInputs."""
    i = inputs
    return dense_attention(i.query, i.key_cache, i.value_cache, i.num_kv_heads, i.scale,
                           i.block_tables, i.seq_lens, i.block_size, i.alibi_slopes,
                           i.kv_cache_dtype, i.k_scale, i.v_scale, num_partitions, mask)


def dense_for_decode(inputs):
    """dense_attention on a paged_attention_ext.tools.testing.DecodeInputs (its NHD cache views)."""
    i = inputs
    return dense_attention(i.query, i.key_cache, i.value_cache, i.num_kv_heads, i.scale,
                           i.block_tables, i.seq_lens, i.block_size, i.alibi_slopes,
                           i.kv_cache_dtype, i.k_scale, i.v_scale, cache_layout="nhd")
