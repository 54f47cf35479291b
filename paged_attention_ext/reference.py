"""The oracle: paged attention v1 / v2 and reshape_and_cache, and decode and
reshape_and_cache_flash over NHD-ordered caches, in plain PyTorch (any device).

Clarity over speed; it is the ground truth the kernels are tested against, and it is itself
checked against an independent float64 dense attention (tests/test_reference.py). It imports
nothing from _C and runs the full argument and data validation (paged_attention_ext.validation)
before touching any output.

Algorithm (per sequence, as the seed but correct):
  1. gather the sequence's K and V through its block table (only the used blocks), decode fp8
     caches to fp32 times k_scale / v_scale, and cut them at seq_len (slots past seq_len may
     hold NaN: they never enter a matmul);
  2. logits = scale * q . k (+ ALiBi slope[h] * (t - seq_len + 1)), one batched matmul over the
     query heads of each KV head (GQA: K/V are not expanded per query head);
     blocksparse (vert_stride > 1): the tokens of the cache blocks a head skips get logit -inf
     (blocksparse_keep, vLLM's rule) and V rows no head of the KV group keeps are zeroed;
  3. split the tokens into partitions of 512 (the tail padded with logit -inf and V = 0) and take
     each partition's (max, exp sum, output normalised by its own exp sum); a partition with no
     attended token is empty: max -inf, exp sum 0, output 0;
  4. v2: store those in max_logits / exp_sums / tmp_out and combine them with partition_weights;
     v1: fold the partitions with merge_stats (the CPU kernel's online merge).
  decode: step 1 gathers through the block table from the NHD-ordered cache
     [num_blocks, block_size, num_kv_heads, head_size] (any strides), steps 2-4 as v1.
  Everything is fp32; out is rounded to the query dtype once, tmp_out is stored in the query dtype.
Steps 3-4 use core.py (merge_stats, inv_sum, partition_weights: csrc/core/compound_state.h
line for line), the pure math the oracle shares with the code it judges, and nothing else.
"""

import math

import torch

from . import op_args, validation
from .core import (PARTITION_SIZE, decode_cache, encode_cache, inv_sum, merge_stats,
                   partition_weights, scale_value)

_NEG_INF = float("-inf")


# ---- attention ----

def blocksparse_keep(sparse, seq_len, block_size, num_heads, num_kv_heads):
    """bool [num_heads, ceil(seq_len / block_size)]: does query head h attend cache block b?
    vLLM's rule (docs/CONTRACT.md), decided per cache block by the sparse block of its FIRST
    token; sparse: validation.Blocksparse (tp_rank and heads counted globally)."""
    b = torch.arange(math.ceil(seq_len / block_size))
    k_blk = b * block_size // sparse.block_size  # sparse block of each cache block's 1st token
    q_blk = (seq_len - 1) // sparse.block_size  # sparse block of the query (the last token)
    tp_rank, step, group = sparse.tp_rank, sparse.head_sliding_step, num_heads // num_kv_heads
    # Heads counted globally: tp_rank * (heads per rank) + local index; query heads when
    # step >= 0, KV heads (h // group) when step < 0. Python ints (exact, no overflow), reduced
    # mod vert_stride (all terms are >= 0, so the test below is unchanged).
    offset = torch.tensor([((tp_rank * num_heads + h) * step + 1 if step >= 0 else
                            (tp_rank * num_kv_heads + h // group) * -step + 1)
                           % sparse.vert_stride for h in range(num_heads)])
    vertical = (k_blk[None, :] + offset[:, None]) % sparse.vert_stride == 0
    local = k_blk > q_blk - sparse.local_blocks
    return vertical | local[None, :]


def _gather_sequence(key_cache, value_cache, block_ids, seq_len, kind, k_scale, v_scale):
    """K, V of one sequence as fp32 [num_kv_heads, seq_len, head_size] (no slot past seq_len)."""
    # key_cache [num_blocks, kv_heads, head_size/x, block_size, x] -> [kv_heads, tokens, head_size]
    k = decode_cache(key_cache[block_ids], kind, k_scale)  # [nb, kvh, d/x, bs, x]
    nb, kvh, dx, bs, x = k.shape
    k = k.permute(1, 0, 3, 2, 4).reshape(kvh, nb * bs, dx * x)[:, :seq_len]
    # value_cache [num_blocks, kv_heads, head_size, block_size] -> [kv_heads, tokens, head_size]
    v = decode_cache(value_cache[block_ids], kind, v_scale)  # [nb, kvh, d, bs]
    v = v.permute(1, 0, 3, 2).reshape(kvh, nb * bs, dx * x)[:, :seq_len]
    return k, v


def _partition_states(query_row, k, v, scale, slopes, seq_len, keep=None):
    """Per-partition summaries of one sequence.

    query_row [num_heads, head_size]; k, v [kvh, seq_len, head_size] fp32; slopes [num_heads] or
    None; keep: bool [num_heads, seq_len] (blocksparse: the tokens each head attends) or None.
    Returns max [H, P], sum [H, P], out [H, P, head_size] (out UNnormalised), P = ceil(L / 512).
    """
    num_heads, head_size = query_row.shape
    kvh = k.shape[0]
    group = num_heads // kvh
    num_parts = math.ceil(seq_len / PARTITION_SIZE)
    padded = num_parts * PARTITION_SIZE

    q = query_row.float().reshape(kvh, group, head_size)
    logits = scale * torch.matmul(q, k.transpose(1, 2))  # [kvh, group, L]
    logits = logits.reshape(num_heads, seq_len)
    if slopes is not None:
        # ALiBi: 0 at the last token (CONTRACT.md), negative before it.
        pos = torch.arange(seq_len, device=logits.device, dtype=torch.float32) - (seq_len - 1)
        logits = logits + slopes.float()[:, None] * pos[None, :]
    if keep is not None:
        # where, not an additive -inf: a skipped block may hold NaN (it is never attended).
        logits = torch.where(keep, logits, _NEG_INF)
        # V of tokens no head of the KV group attends: zero (0 * NaN would be NaN).
        v = torch.where(keep.reshape(kvh, group, seq_len).any(dim=1)[..., None], v, 0.0)

    # Pad the tail partition: logit -inf (weight 0) and V rows 0 (NOTE: zero V, not only the
    # logits, so nothing but finite values meets the matmul).
    logits = torch.nn.functional.pad(logits, (0, padded - seq_len), value=_NEG_INF)
    v = torch.nn.functional.pad(v, (0, 0, 0, padded - seq_len), value=0.0)

    logits = logits.reshape(num_heads, num_parts, PARTITION_SIZE)
    part_max = logits.amax(dim=-1)  # [H, P]; -inf for a partition with no attended token
    safe_max = torch.where(part_max == _NEG_INF, 0.0, part_max)  # exp(-inf - 0) = 0, not NaN
    p = torch.exp(logits - safe_max[..., None])  # [H, P, 512]
    part_sum = p.sum(dim=-1)  # [H, P]
    # [kvh, group, P, 512] x [kvh, P, 512, d] -> [kvh, group, P, d]
    part_out = torch.einsum("kgpt,kptd->kgpd", p.reshape(kvh, group, num_parts, PARTITION_SIZE),
                            v.reshape(kvh, num_parts, PARTITION_SIZE, head_size))
    return part_max, part_sum, part_out.reshape(num_heads, num_parts, head_size)


def _fold_partitions(part_max, part_sum, part_out):
    """v1's online merge: fold the partitions (max, sum [H, P], UNnormalised out [H, P, d]) one by
    one with merge_stats, then normalise. Returns [H, d] fp32."""
    acc_max = torch.full_like(part_max[:, 0], _NEG_INF)
    acc_sum = torch.zeros_like(part_sum[:, 0])
    acc_out = torch.zeros_like(part_out[:, 0])
    for p in range(part_max.shape[1]):
        acc_max, acc_sum, fa, fb = merge_stats(acc_max, acc_sum, part_max[:, p], part_sum[:, p])
        acc_out = acc_out * fa[:, None] + part_out[:, p] * fb[:, None]
    return acc_out * inv_sum(acc_sum)[:, None]


def _attention(op, args):
    """v1 / v2 (args: op_args.V1Args / V2Args)."""
    a = args
    kind = validation.check_attention_args(op, a)
    validation.check_attention_data(op, a)
    sparse = validation.blocksparse_spec(a)
    out, query, block_size = a.out, a.query, a.block_size
    exp_sums, max_logits, tmp_out = op_args.scratch(a)
    num_heads = query.shape[1]
    ks = scale_value(a.k_scale, query.device)
    vs = scale_value(a.v_scale, query.device)

    for s, seq_len in enumerate(a.seq_lens.tolist()):
        if seq_len == 0:
            out[s].zero_()
            continue
        num_used_blocks = math.ceil(seq_len / block_size)
        block_ids = a.block_tables[s, :num_used_blocks].long()
        k, v = _gather_sequence(a.key_cache, a.value_cache, block_ids, seq_len, kind, ks, vs)
        keep = None
        if sparse is not None:  # per cache block -> per token [num_heads, seq_len]
            keep = blocksparse_keep(sparse, seq_len, block_size, num_heads, a.num_kv_heads)
            keep = keep.repeat_interleave(block_size, dim=1)[:, :seq_len].to(query.device)
        part_max, part_sum, part_out = _partition_states(query[s], k, v, a.scale, a.alibi_slopes,
                                                         seq_len, keep)
        num_parts = part_max.shape[1]
        if tmp_out is not None:  # v2: partition summaries, then the phase-2 combine
            part_out_normed = part_out * inv_sum(part_sum)[..., None]  # [H, P, d]
            max_logits[s, :, :num_parts] = part_max
            exp_sums[s, :, :num_parts] = part_sum
            tmp_out[s, :, :num_parts] = part_out_normed.to(tmp_out.dtype)
            w = partition_weights(part_max, part_sum)  # [H, P]
            result = (w[..., None] * part_out_normed).sum(dim=1)  # [H, d]
        else:  # v1: fold the partitions one by one (online merge)
            result = _fold_partitions(part_max, part_sum, part_out)
        out[s] = result.to(out.dtype)


# The public functions take the ops' arguments (op_args.function: schemas.py's names, order and
# defaults, positionally or by name) and hand them on as one record.
paged_attention_v1 = op_args.function("v1", _attention, """\
out [num_seqs, num_heads, head_size] <- paged attention (vLLM's v1 contract).""")

paged_attention_v2 = op_args.function("v2", _attention, """\
out as v1; exp_sums / max_logits [num_seqs, num_heads, P] (fp32) and tmp_out
[num_seqs, num_heads, P, head_size] (query dtype, normalised per partition) for the partitions
p < ceil(seq_len / 512) of each row. Scratch past a row's partitions is left untouched.""")


# ---- reshape_and_cache ----

def _reshape_and_cache(op, args):
    kind = validation.check_cache_args(op, args)
    validation.check_cache_data(op, args)
    key, value, key_cache, value_cache, slot_mapping = (args.key, args.value, args.key_cache,
                                                        args.value_cache, args.slot_mapping)
    kvh, head_size = key.shape[1:]
    block_size, x = key_cache.shape[3], key_cache.shape[4]

    tokens = (slot_mapping >= 0).nonzero().squeeze(1)
    slots = slot_mapping[tokens]
    blocks, offsets = slots // block_size, slots % block_size
    k = encode_cache(key[tokens], kind, scale_value(args.k_scale, key.device))
    v = encode_cache(value[tokens], kind, scale_value(args.v_scale, key.device))
    # key_cache[b, :, :, o, :] is [kvh, head_size/x, x]; value_cache[b, :, :, o] is [kvh, head_size].
    key_cache[blocks, :, :, offsets, :] = k.reshape(-1, kvh, head_size // x, x)
    value_cache[blocks, :, :, offsets] = v


reshape_and_cache = op_args.function("reshape_and_cache", _reshape_and_cache, """\
Write token i's key/value [num_kv_heads, head_size] (i < slot_mapping.size(0); rows of key /
value past it are padding, never read) into slot slot_mapping[i] (= block * block_size +
offset) of the caches; negative slots are padding and skipped.""")


# ---- NHD / HND caches: decode and reshape_and_cache_flash (CONTRACT.md "NHD / HND caches") ----

def _gather_sequence_nhd(cache, block_ids, seq_len, kind, scale):
    """The tokens of one sequence as fp32 [num_kv_heads, seq_len, head_size].
    cache [num_blocks, block_size, kv_heads, head_size], any strides (an HND cache's view too)."""
    t = decode_cache(cache[block_ids], kind, scale)  # [nb, bs, kvh, d]
    nb, bs, kvh, d = t.shape
    return t.reshape(nb * bs, kvh, d)[:seq_len].transpose(0, 1)  # [kvh, seq_len, d]


def _decode(op, args):
    a = args
    kind = validation.check_decode_args(op, a)
    validation.check_decode_data(op, a)
    out, query = a.out, a.query
    block_size = a.key_cache.size(1)
    ks = scale_value(a.k_scale, query.device)
    vs = scale_value(a.v_scale, query.device)

    for s, seq_len in enumerate(a.seq_lens.tolist()):
        if seq_len == 0:
            out[s].zero_()
            continue
        block_ids = a.block_tables[s, :math.ceil(seq_len / block_size)].long()
        k = _gather_sequence_nhd(a.key_cache, block_ids, seq_len, kind, ks)
        v = _gather_sequence_nhd(a.value_cache, block_ids, seq_len, kind, vs)
        part_max, part_sum, part_out = _partition_states(query[s], k, v, a.scale, a.alibi_slopes,
                                                         seq_len)
        out[s] = _fold_partitions(part_max, part_sum, part_out).to(out.dtype)


decode = op_args.function("decode", _decode, """\
out [num_seqs, num_heads, head_size] <- decode attention over NHD-ordered paged caches
[num_blocks, block_size, num_kv_heads, head_size] (any strides, last dim contiguous);
the same result as v1 on the same K/V.""")


def _reshape_and_cache_flash(op, args):
    kind = validation.check_flash_cache_args(op, args)
    validation.check_flash_cache_data(op, args)
    key, value, key_cache, slot_mapping = args.key, args.value, args.key_cache, args.slot_mapping
    block_size = key_cache.size(1)

    tokens = (slot_mapping >= 0).nonzero().squeeze(1)
    slots = slot_mapping[tokens]
    blocks, offsets = slots // block_size, slots % block_size
    # key_cache[b, o] is [num_kv_heads, head_size]; indexing a view writes through to its storage.
    key_cache[blocks, offsets] = encode_cache(key[tokens], kind,
                                              scale_value(args.k_scale, key.device))
    args.value_cache[blocks, offsets] = encode_cache(value[tokens], kind,
                                                     scale_value(args.v_scale, key.device))


reshape_and_cache_flash = op_args.function("reshape_and_cache_flash", _reshape_and_cache_flash,
                                           """\
Write token i's key/value [num_kv_heads, head_size] (i < slot_mapping.size(0); rows of
key / value past it are padding) into slot slot_mapping[i] (= block * block_size + offset)
of the NHD-ordered caches; negative slots are padding and skipped.""")
