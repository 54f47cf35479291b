"""Blocksparse attention outside the oracle: the PyTorch fallback against the oracle (the cases
of tests/test_blocksparse_reference.py, each under several chunkings), its sync-freedom, and who
serves a blocksparse call: the PyTorch implementation, the C++ CPU kernel and the CUDA kernel
compute it (every backend, each CPU variant and CUDA kernel choice, is checked case by case in
tests/test_conformance.py), never a dense result.
"""

from types import SimpleNamespace

import pytest
import torch

from paged_attention_ext import api, fallback, reference
from paged_attention_ext.integrations import vllm_compat
from paged_attention_ext.tools import backends, conformance, testing
from paged_attention_ext.validation import Blocksparse
from support.blocksparse import CASES
from support.blocksparse import inputs as _inputs
from support.blocksparse import mask as _mask
from support.blocksparse import poison_skipped as _poison_skipped


FALLBACK = backends.fallback_ops()  # the fallback's functions, called directly


def _check(ops, inputs, sparse):
    """ops.v1 / ops.v2 (torch.ops or the fallback) against the oracle; outputs NaN-filled."""
    conformance.require(*conformance.attention(ops, inputs, blocksparse=sparse))


@pytest.mark.parametrize("index,case", list(enumerate(CASES)), ids=[c[0] for c in CASES])
def test_fallback_matches_oracle(index, case, chunking):
    _check(FALLBACK, _inputs(case, seed=200 + index), case[2])


@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[7]], ids=lambda c: c[0])
def test_fallback_ignores_nan_in_skipped_blocks(case, chunking):
    inputs = _inputs(case, seed=8)
    poisoned = _poison_skipped(inputs, _mask(inputs, case[2]))
    _check(FALLBACK, poisoned, case[2])


def test_fallback_compiles_fullgraph():
    """Sync-free with blocksparse too: a host sync or data-dependent branch breaks the graph."""
    torch._dynamo.reset()
    case = CASES[2]
    inputs = _inputs(case, seed=9, seq_lens=[523, 0, 37])
    compiled = SimpleNamespace(v2=torch.compile(fallback.paged_attention_v2, fullgraph=True,
                                                backend="aot_eager"))
    conformance.require(conformance.v2(compiled, inputs, blocksparse=case[2])[0])


# ---- who serves a blocksparse call ----

@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_ops_compute_blocksparse(device):
    """torch.ops.paged_attn: the compiled kernel of the device (C++ CPU, CUDA) or the PyTorch
    implementation (no compiled kernel for the device, e.g. PAGED_ATTN_DISABLE_EXTENSION=1)
    matches the oracle, NaN in the skipped blocks."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False)")
    case = CASES[1]
    inputs = _inputs(case, seed=10)
    inputs = _poison_skipped(inputs, _mask(inputs, case[2]))
    if device == "cuda":
        inputs = testing.AttentionInputs(**{**vars(inputs), **{
            f: getattr(inputs, f).to(device) for f in
            ("query", "key_cache", "value_cache", "block_tables", "seq_lens", "alibi_slopes")
            if getattr(inputs, f) is not None}})
    _check(torch.ops.paged_attn, inputs, case[2])


def test_vllm_compat_and_api_route_blocksparse_like_the_ops():
    # vLLM's keyword names through vllm_compat, and api.paged_attention's keywords: the CPU ops
    # (C++ kernel or PyTorch implementation) compute them, never ignore them.
    case = CASES[3]
    i = _inputs(case, seed=11)
    sparse = case[2]
    kwargs = dict(tp_rank=sparse.tp_rank, blocksparse_local_blocks=sparse.local_blocks,
                  blocksparse_vert_stride=sparse.vert_stride,
                  blocksparse_block_size=sparse.block_size,
                  blocksparse_head_sliding_step=sparse.head_sliding_step)
    want = testing.call_v2(reference.paged_attention_v2, i, testing.alloc_v2_outputs(i), sparse)
    outs = testing.alloc_v2_outputs(i)
    calls = {
        "vllm_compat.v2": lambda: vllm_compat.paged_attention_v2(
            *outs, i.query, i.key_cache, i.value_cache, i.num_kv_heads, i.scale, i.block_tables,
            i.seq_lens, i.block_size, i.max_seq_len, i.alibi_slopes, **kwargs) or outs.out,
        "vllm_compat.v1": lambda: vllm_compat.paged_attention_v1(
            outs.out, i.query, i.key_cache, i.value_cache, i.num_kv_heads, i.scale,
            i.block_tables, i.seq_lens, i.block_size, i.max_seq_len, i.alibi_slopes,
            **kwargs) or outs.out,
    }
    for version in ("v1", "v2"):
        for validate in (False, True):
            calls[f"api.{version}.validate={validate}"] = (
                lambda v=version, val=validate: api.paged_attention(
                    i.query, i.key_cache, i.value_cache, i.block_tables, i.seq_lens,
                    version=v, validate=val, out=outs.out, **kwargs))
    for name, call in calls.items():
        outs.out.fill_(float("nan"))
        testing.assert_out_matches(call(), want.out, i.dtype, name=name)


def test_api_validate_rejects_bad_blocksparse_arguments():
    i = _inputs(CASES[0], seed=12)
    with pytest.raises(ValueError, match=r"blocksparse_block_size \(0\) must be > 0"):
        api.paged_attention(i.query, i.key_cache, i.value_cache, i.block_tables, i.seq_lens,
                            validate=True, blocksparse_vert_stride=2, blocksparse_block_size=0)


def test_fake_kernels_accept_blocksparse():
    # torch.compile traces through the fake (meta) kernels: they accept an active blocksparse
    # call (the real kernel then computes it) and reject bad blocksparse arguments.
    i = _inputs(CASES[0], seed=13)
    meta = {f: getattr(i, f).to("meta") for f in
            ("query", "key_cache", "value_cache", "block_tables", "seq_lens")}
    m = testing.AttentionInputs(**{**vars(i), **meta})
    out = torch.empty_like(m.query)
    testing.call_v1(torch.ops.paged_attn.v1, m, out, Blocksparse(1, 2, 4, 16, -1))
    with pytest.raises(ValueError, match=r"tp_rank \(-1\) must be >= 0"):
        testing.call_v1(torch.ops.paged_attn.v1, m, out, Blocksparse(-1, 2, 4, 16, 0))
