"""Blocksparse attention (docs/CONTRACT.md, "Blocksparse"): the oracle against the float64 dense
attention (tests/dense_reference.py) given an explicit boolean mask that this file builds from
the definition, one token at a time with plain Python (nothing shared with
reference.blocksparse_keep). Inputs as everywhere: sharp softmax, shuffled block tables with
garbage, NaN in unused cache slots, NaN-prefilled outputs.
"""

import pytest
import torch

from support import blocksparse
from support.blocksparse import CASES, SEQ_LENS, definition_mask, per_token_mask
from support.dense_reference import dense_for
from paged_attention_ext import reference
from paged_attention_ext.tools import testing
from paged_attention_ext.tools.testing import V2Outputs
from paged_attention_ext.validation import Blocksparse

def _check_against_dense(inputs, sparse, mask):
    """Oracle v2 (out and scratch) and v1 vs float64 dense attention under `mask`."""
    v2 = testing.call_v2(reference.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs),
                         sparse)
    d = dense_for(inputs, v2.tmp_out.shape[2], mask)
    dense = V2Outputs(d.out, d.exp_sums, d.max_logits, d.tmp_out)
    testing.assert_v2_matches(v2, dense, inputs.seq_lens_list, inputs.dtype, inputs.kv_cache_dtype)
    v1 = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs),
                         sparse)
    testing.assert_out_matches(v1, d.out, inputs.dtype, inputs.kv_cache_dtype, name="v1 out")
    return v2


@pytest.mark.parametrize("index,case", list(enumerate(CASES)), ids=[c[0] for c in CASES])
def test_oracle_matches_dense_with_the_definitions_mask(index, case):
    inputs = blocksparse.inputs(case, seed=100 + index)
    sparse = case[2]
    mask = blocksparse.mask(inputs, sparse)
    lens = torch.tensor(SEQ_LENS)
    in_row = torch.arange(mask.shape[2])[None, None, :] < lens[:, None, None]
    # The case is sparse: some attended tokens, some skipped ones (else it proves nothing).
    assert mask.any() and (in_row & ~mask).any(), case[0]
    _check_against_dense(inputs, sparse, mask)


def test_the_definition_by_hand():
    # Cache blocks of 4 tokens, sparse blocks of 8 (2 cache blocks), 37 tokens: cache blocks
    # 0..9, q = 36 // 8 = 4. tp_rank 1, 2 heads, step 1: offsets 3 and 4; vert 3, local 1.
    # Local: k > 3 -> k = 4 (cache blocks 8, 9). Head 0: (k + 3) % 3 == 0 -> k in {0, 3} (blocks
    # 0, 1, 6, 7). Head 1: (k + 4) % 3 == 0 -> k = 2 (blocks 4, 5).
    mask = definition_mask([37], 2, 1, 4, Blocksparse(1, 1, 3, 8, 1))[0]
    blocks = lambda h: sorted({t // 4 for t in range(37) if mask[h, t]})  # noqa: E731
    assert blocks(0) == [0, 1, 6, 7, 8, 9] and blocks(1) == [4, 5, 8, 9]
    # Sparse blocks of 12 over cache blocks of 8, 40 tokens: the cache blocks start at tokens
    # 0, 8, 16, 24, 32 -> k = 0, 0, 1, 2, 2; q = 39 // 12 = 3, so with local 1 nothing is local
    # (the block holding the query starts in sparse block 2). vert 2, offset 1: k = 1 -> block 2.
    mask = definition_mask([40], 1, 1, 8, Blocksparse(0, 1, 2, 12, 0))[0]
    assert sorted({t // 8 for t in range(40) if mask[0, t]}) == [2]
    # Negative step: both query heads of a KV head share the pattern; KV heads differ.
    mask = definition_mask([64], 4, 2, 8, Blocksparse(0, 0, 2, 8, -1))[0]
    assert torch.equal(mask[0], mask[1]) and torch.equal(mask[2], mask[3])
    assert not torch.equal(mask[0], mask[2])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_per_cache_block_decision_matters_exactly_for_non_multiples(case):
    # vLLM's kernel decides per cache block (by its first token); its Python test decides per
    # token. They agree iff the sparse block size is a multiple of the cache block size, so
    # the non-multiple cases above would catch an oracle deciding per token.
    _, (h, kvh, _, bs), sparse, *_ = case
    same = torch.equal(definition_mask(SEQ_LENS, h, kvh, bs, sparse),
                       per_token_mask(SEQ_LENS, h, kvh, sparse))
    assert same == (sparse.block_size % bs == 0)


def test_nothing_attended_gives_zeros_and_empty_partitions():
    # Vertical only, offset 1, vert 2: sparse block 0 is skipped for every head, so a row whose
    # cache blocks all start in sparse block 0 attends nothing (zeros); in the 1100-token row
    # the partitions are partly empty (max_logits -inf, exp_sums 0, tmp_out 0).
    case = ("empty", (4, 2, 32, 8), Blocksparse(0, 0, 2, 600, 0), torch.float32, "auto", False)
    inputs = blocksparse.inputs(case, seed=7, seq_lens=[1, 100, 1100])
    v2 = _check_against_dense(inputs, case[2], blocksparse.mask(inputs, case[2]))
    assert torch.equal(v2.out[:2], torch.zeros_like(v2.out[:2]))
    assert (v2.max_logits[2, :, 0] == float("-inf")).all() and (v2.exp_sums[2, :, 0] == 0).all()
    assert (v2.tmp_out[2, :, 0] == 0).all() and v2.out[2].abs().sum() > 0


def _nans(cache):
    nan = cache.isnan() if cache.is_floating_point() else cache == testing.FP8_NAN_BYTE
    return int(nan.sum())


@pytest.mark.parametrize("case", [CASES[2], CASES[5], CASES[6]], ids=lambda c: c[0])
def test_skipped_blocks_may_hold_nan(case):
    inputs = blocksparse.inputs(case, seed=8)
    mask = blocksparse.mask(inputs, case[2])
    poisoned = blocksparse.poison_skipped(inputs, mask)
    assert _nans(poisoned.value_cache) > _nans(inputs.value_cache)  # something was poisoned
    _check_against_dense(poisoned, case[2], mask)


@pytest.mark.parametrize("vert_stride", [0, 1, -3])
def test_inactive_blocksparse_ignores_the_other_arguments(vert_stride):
    # vert_stride <= 1 is dense attention, whatever the other four say (as in vLLM).
    case = CASES[0]
    inputs = blocksparse.inputs(case, seed=9)
    garbage = Blocksparse(-5, -1, vert_stride, 0, 7)
    _check_against_dense(inputs, garbage, None)
