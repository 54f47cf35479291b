"""Blocksparse test material (docs/CONTRACT.md, "Blocksparse"): the cases, the mask built from the
definition one token at a time in plain Python (nothing shared with reference.blocksparse_keep),
and inputs whose skipped blocks hold NaN, so that a kernel reading one shows it."""

import dataclasses

import torch

from paged_attention_ext.tools import testing
from paged_attention_ext.validation import Blocksparse

# Lengths: 1 token, odd short ones, past a partition edge, 3 partitions, none a multiple of
# anything; and 1344 = 2^6 * 3 * 7, a multiple of every sparse block size below (the query is the
# last token of its sparse block: q = (seq_len - 1) // bs, not seq_len // bs).
SEQ_LENS = [1, 37, 203, 523, 1100, 1344, 0]


def definition_mask(seq_lens, num_heads, num_kv_heads, block_size, sparse):
    """bool [num_seqs, num_heads, max(seq_lens, 1)], True where head h attends token t.

    The definition: token t lies in cache block t // block_size; that block is kept for head h
    iff, with k = (its first token) // sparse block size and q = (seq_len - 1) // sparse block
    size, (k + offset_h) % vert_stride == 0 or k > q - local_blocks. offset_h = (tp_rank *
    num_heads + h) * step + 1 for step >= 0, else (tp_rank * num_kv_heads + kv head of h) *
    (-step) + 1."""
    tp_rank, local, vert, sparse_block, step = sparse
    group = num_heads // num_kv_heads
    rows = []
    for n in seq_lens:
        q = (n - 1) // sparse_block
        heads = []
        for h in range(num_heads):
            if step >= 0:
                offset = (tp_rank * num_heads + h) * step + 1
            else:
                offset = (tp_rank * num_kv_heads + h // group) * (-step) + 1
            row = []
            for t in range(max(seq_lens + [1])):
                k = (t // block_size) * block_size // sparse_block
                row.append(t < n and ((k + offset) % vert == 0 or k > q - local))
            heads.append(row)
        rows.append(heads)
    return torch.tensor(rows, dtype=torch.bool)


def per_token_mask(seq_lens, num_heads, num_kv_heads, sparse):
    """The same rule decided per TOKEN (k = t // sparse block size), as vLLM's own test
    reference writes it (tests/kernels/attention/test_blocksparse_attention.py); equal to the
    definition exactly when the sparse block size is a multiple of the cache block size."""
    return definition_mask(seq_lens, num_heads, num_kv_heads, 1, sparse)


# (id, (heads, kv_heads, head_size, block_size), Blocksparse(tp_rank, local_blocks, vert_stride,
#  sparse block_size, head_sliding_step), dtype, kv_cache_dtype, alibi)
CASES = [
    ("gqa-tp0-step0", (8, 2, 32, 8), Blocksparse(0, 2, 4, 16, 0),
     torch.float32, "auto", False),
    ("gqa-tp1-step2-phi3", (8, 2, 32, 16), Blocksparse(1, 3, 8, 64, 2),
     torch.float32, "auto", True),
    ("gqa-tp3-step-1", (8, 2, 32, 8), Blocksparse(3, 1, 4, 32, -1),
     torch.bfloat16, "auto", False),
    ("mha-tp2-step-2-equal-blocks", (4, 4, 32, 16), Blocksparse(2, 2, 5, 16, -2),
     torch.float16, "auto", False),
    ("mqa-local-only-not-multiple", (4, 1, 32, 8), Blocksparse(0, 4, 10**6, 24, 0),
     torch.float32, "auto", False),
    ("vertical-only", (6, 2, 32, 16), Blocksparse(1, 0, 4, 64, 1),
     torch.float32, "fp8_e4m3", False),
    ("sparse-block-smaller-than-cache-block", (4, 2, 32, 16), Blocksparse(0, 2, 3, 4, 1),
     torch.float32, "auto", True),
    ("not-multiple-straddling", (4, 2, 32, 8), Blocksparse(1, 1, 3, 12, -1),
     torch.bfloat16, "fp8_e5m2", False),
    ("block-size-5", (8, 1, 32, 5), Blocksparse(0, 3, 3, 7, 3),
     torch.float32, "auto", False),
]


def inputs(case, seed, seq_lens=SEQ_LENS):
    _, (h, kvh, d, bs), _, dtype, kv, alibi = case
    return testing.make_attention_inputs(len(seq_lens), h, kvh, d, bs, seq_lens, dtype=dtype,
                                         kv_cache_dtype=kv, use_alibi=alibi, seed=seed)


def mask(inputs, sparse):
    return definition_mask(inputs.seq_lens_list, inputs.num_heads, inputs.num_kv_heads,
                           inputs.block_size, sparse)


def poison_skipped(inputs, mask):
    """Copy of inputs whose K/V are NaN in every (cache block, KV head) that no query head of
    that KV head attends."""
    kc, vc = inputs.key_cache.clone(), inputs.value_cache.clone()
    nan = float("nan") if kc.is_floating_point() else testing.FP8_NAN_BYTE
    group = inputs.num_heads // inputs.num_kv_heads
    for s, n in enumerate(inputs.seq_lens_list):
        for b in range(-(-n // inputs.block_size)):
            block = int(inputs.block_tables[s, b])
            tokens = slice(b * inputs.block_size, min(n, (b + 1) * inputs.block_size))
            for kv_h in range(inputs.num_kv_heads):
                if not mask[s, kv_h * group:(kv_h + 1) * group, tokens].any():
                    kc[block, kv_h] = nan
                    vc[block, kv_h] = nan
    return dataclasses.replace(inputs, key_cache=kc, value_cache=vc)
