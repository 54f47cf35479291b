"""What only the PyTorch fallback (paged_attention_ext.fallback) has: its chunk plan, its
sync-freedom, and what it does off the CPU where no data check may sync. Its results against the
oracle, under each of its chunkings (the default plan, one partition of one sequence per sub-chunk
in one pass each or all in one pass, everything in one sub-chunk), are tests/test_conformance.py.

- the plan: every (row, partition) once, no sub-chunk or pass over its byte budget;
- sync-freedom: torch.compile(fullgraph=True) traces v1, v2 and reshape_and_cache on CPU (a
  .item(), .tolist(), data-dependent shape or branch on tensor data would break the graph), and a
  CUDA graph captures v2 and replays it with new lengths and tables (skipped without CUDA);
- without data checks (off the CPU), a bad row is NaN and an out-of-range slot is skipped,
  never a wild read or write; on the CPU the checks raise;
- block sizes that do not divide the 512-token partition within a multi-partition chunk.
"""

import math
from types import SimpleNamespace

import pytest
import torch

from paged_attention_ext import fallback, reference
from paged_attention_ext.tools import backends, conformance, testing
from paged_attention_ext.validation import PARTITION_SIZE

# The fallback's functions called directly (not through torch.ops, where a compiled kernel would
# answer instead).
FALLBACK = backends.fallback_ops()


def _inputs(case, seed, seq_lens, **kw):
    dtype, kv, (h, kvh, d, bs), alibi = case
    return testing.make_attention_inputs(len(seq_lens), h, kvh, d, bs, seq_lens, dtype=dtype,
                                         kv_cache_dtype=kv, use_alibi=alibi, seed=seed, **kw)


def _check(inputs, max_num_partitions=None, ops=FALLBACK):
    """v2 (out + scratch of the partitions in use) and v1 vs the oracle, outputs NaN-filled."""
    conformance.require(*conformance.attention(ops, inputs, max_num_partitions))


def test_bad_rows_raise_on_cpu():
    # CPU tensors: the data checks run (the CPU contract), e.g. a used block id out of range.
    inputs = _inputs((torch.float32, "auto", (4, 2, 32, 16), False), seed=3, seq_lens=[40, 20])
    inputs.block_tables[1, 0] = inputs.num_blocks
    with pytest.raises(ValueError, match=r"block_tables\[1, 0\] = \d+ is out of range"):
        testing.call_v1(fallback.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))


def test_bad_rows_are_nan_without_checks(monkeypatch):
    # Off the CPU nothing may sync, so a forbidden row is flagged in the data: its output is NaN
    # (never a wild read), the other rows are right.
    monkeypatch.setattr(fallback, "_run_data_checks", lambda device: False)
    inputs = _inputs((torch.float32, "auto", (4, 2, 32, 16), False), seed=4,
                     seq_lens=[40, 20, 33, 600])
    want = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    inputs.block_tables[1, 1] = -1  # a used id out of range
    inputs.block_tables[2, 0] = inputs.num_blocks + 3
    outs = testing.alloc_v2_outputs(inputs, max_num_partitions=1)  # too small for row 3
    testing.call_v2(fallback.paged_attention_v2, inputs, outs)
    assert outs.out[1:].isnan().all()
    testing.assert_out_matches(outs.out[:1], want[:1], torch.float32)


def test_bad_rows_are_nan_without_checks_at_the_bounds(monkeypatch):
    # The sync-free flags at their exact bounds, one rule broken by the least amount per row:
    # seq_len = capacity + 1 with every table entry valid (v1 / v2 would silently drop the last
    # token; with garbage past the used blocks the bad-id flag would catch the row instead),
    # seq_len = -1 (would give zeros), a used block id equal to num_blocks (clamped, block
    # num_blocks - 1 would be read silently). Block num_blocks - 1 is made all finite, else its
    # NaN poison would hide these reads.
    monkeypatch.setattr(fallback, "_run_data_checks", lambda device: False)
    inputs = _inputs((torch.float32, "auto", (4, 2, 32, 16), False), seed=6,
                     seq_lens=[40, 20, 33, 50])
    inputs.key_cache[-1] = torch.randn(inputs.key_cache.shape[1:])
    inputs.value_cache[-1] = torch.randn(inputs.value_cache.shape[1:])
    want = testing.call_v1(reference.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    capacity = inputs.block_tables.shape[1] * inputs.block_size
    inputs.block_tables[1] = inputs.num_blocks - 1
    inputs.seq_lens[1] = capacity + 1
    inputs.seq_lens[2] = -1
    inputs.block_tables[3, 2] = inputs.num_blocks  # used: row 3 has 4 blocks
    v1 = testing.call_v1(fallback.paged_attention_v1, inputs, testing.alloc_v1_outputs(inputs))
    v2 = testing.call_v2(fallback.paged_attention_v2, inputs, testing.alloc_v2_outputs(inputs)).out
    for out in (v1, v2):
        assert out[1:].isnan().all()
        testing.assert_out_matches(out[:1], want[:1], torch.float32)


@pytest.mark.parametrize("budget_scale", [1, fallback.ACCELERATOR_BUDGET_SCALE])
@pytest.mark.parametrize("aligned", [True, False])
def test_plan_is_bounded_and_covers_everything(aligned, budget_scale):
    # (rows, extent in tokens, fp32 K bytes per row-token, logit bytes per row-token): every
    # (row, partition) once, partitions of 512 tokens but a partial last one (a pass of its own),
    # no sub-chunk over the K budget unless it is one partition of one row, no pass over the
    # logit budget unless it is one sub-chunk, one partition per sub-chunk when not aligned.
    for seqs, extent, per_token, logit_per_token in [
            (8, 4096, 4096, 128), (8, 16384, 4096, 128), (3, 100_000, 4096, 96),
            (64, 288, 4096, 128), (5, 1100, 8192, 64), (1, 1, 1, 4)]:
        plan = fallback._plan(seqs, extent, per_token, logit_per_token, aligned, budget_scale)
        covered = [(s, p, part_len) for s0, s1, passes in plan
                   for p0, p1, part_len, step in passes
                   for s in range(s0, s1) for p in range(p0, p1)]
        num_parts = math.ceil(extent / PARTITION_SIZE)
        want = [(s, p, min(PARTITION_SIZE, extent - p * PARTITION_SIZE))
                for s in range(seqs) for p in range(num_parts)]
        assert sorted(covered) == sorted(want)
        for s0, s1, passes in plan:
            for p0, p1, part_len, step in passes:
                assert aligned or step == 1
                sub_chunk = (s1 - s0) * step * part_len * per_token
                assert sub_chunk <= max(fallback.CHUNK_BYTES * budget_scale,
                                        PARTITION_SIZE * per_token)
                pass_logits = (s1 - s0) * (p1 - p0) * part_len * logit_per_token
                assert pass_logits <= max(fallback.PASS_LOGIT_BYTES * budget_scale,
                                          (s1 - s0) * step * part_len * logit_per_token)


# ---- cache writes ----

@pytest.mark.parametrize("op", ["reshape_and_cache", "reshape_and_cache_flash"])
def test_cache_write_skips_out_of_range_slots_without_checks(monkeypatch, op):
    # Off the CPU nothing may sync, so a slot >= num_blocks * block_size (the CPU rejects it) is
    # skipped like a padding slot: never an out-of-bounds write, the other tokens written.
    monkeypatch.setattr(fallback, "_run_data_checks", lambda device: False)
    if op == "reshape_and_cache":
        inputs = _inputs((torch.bfloat16, "fp8_e4m3", (4, 2, 64, 16), False), seed=8,
                         seq_lens=[30, 17])
    else:
        inputs = testing.make_decode_inputs(2, 4, 2, 64, 16, [30, 17], layout="hnd",
                                            dtype=torch.bfloat16, kv_cache_dtype="fp8_e4m3",
                                            seed=8)
    num_slots = inputs.num_blocks * 16
    gen = torch.Generator().manual_seed(3)
    key = torch.randn(6, 2, 64, generator=gen).to(torch.bfloat16)
    value = torch.randn(6, 2, 64, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([5, num_slots, 40, -1, num_slots + 7, 0])
    kept = torch.where(slots < num_slots, slots, -1)  # what the write must do
    caches = []
    for fn, slot_mapping in ((getattr(FALLBACK, op), slots),
                             (getattr(reference, op), kept)):
        k_cache = conformance.same_layout_copy(inputs.key_cache)
        v_cache = conformance.same_layout_copy(inputs.value_cache)
        fn(key, value, k_cache, v_cache, slot_mapping, "fp8_e4m3", inputs.k_scale, inputs.v_scale)
        caches.append((k_cache, v_cache))
    (got_k, got_v), (want_k, want_v) = caches
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not torch.equal(want_k, inputs.key_cache)  # the live tokens were written


# ---- sync-freedom ----

def test_compile_fullgraph_v1_v2():
    """A graph break (host sync, data-dependent shape or branch) fails fullgraph=True."""
    torch._dynamo.reset()
    case = (torch.bfloat16, "fp8_e4m3", (8, 2, 64, 16), True)
    inputs = _inputs(case, seed=9, seq_lens=[513, 0, 37], scale_as_tensor=True)
    compiled = SimpleNamespace(**{op: torch.compile(getattr(FALLBACK, op), fullgraph=True,
                                                    backend="aot_eager") for op in ("v1", "v2")})
    _check(inputs, ops=compiled)


def test_compile_fullgraph_reshape_and_cache():
    torch._dynamo.reset()
    inputs = _inputs((torch.float32, "fp8_e5m2", (4, 2, 64, 16), False), seed=2,
                     seq_lens=[20, 9], scale_as_tensor=True)
    key, value = torch.randn(5, 2, 64), torch.randn(5, 2, 64)
    slots = torch.tensor([3, -1, 40, 7, -1])
    compiled = SimpleNamespace(reshape_and_cache=torch.compile(
        FALLBACK.reshape_and_cache, fullgraph=True, backend="aot_eager"))
    conformance.require(conformance.cache_write(compiled, "reshape_and_cache", key, value,
                                                inputs.key_cache, inputs.value_cache, slots,
                                                "fp8_e5m2", inputs.k_scale, inputs.v_scale))


@pytest.mark.slow
def test_compile_inductor_v2():
    """The full compiler stack (inductor code generation), not only tracing."""
    torch._dynamo.reset()
    case = (torch.float32, "auto", (8, 2, 64, 5), True)
    inputs = _inputs(case, seed=10, seq_lens=[600, 1, 0])
    compiled = SimpleNamespace(v2=torch.compile(FALLBACK.v2, fullgraph=True))
    conformance.require(conformance.v2(compiled, inputs)[0])


def _to_device(inputs, device):
    fields = {f: getattr(inputs, f).to(device) for f in
              ("query", "key_cache", "value_cache", "block_tables", "seq_lens")}
    if inputs.alibi_slopes is not None:
        fields["alibi_slopes"] = inputs.alibi_slopes.to(device)
    return testing.AttentionInputs(**{**vars(inputs), **fields})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")
def test_cuda_graph_capture_and_replay_with_new_lengths():
    case = (torch.float16, "auto", (8, 2, 64, 16), True)
    first = _inputs(case, seed=1, seq_lens=[700, 33, 1])
    # Same pool size and table width (the lengths permuted), other tables: replay must follow.
    second = _inputs(case, seed=2, seq_lens=[33, 1, 700])
    assert first.block_tables.shape == second.block_tables.shape
    static = _to_device(first, "cuda")
    outs = testing.alloc_v2_outputs(static, max_num_partitions=3)
    testing.call_v2(fallback.paged_attention_v2, static, outs)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        testing.call_v2(fallback.paged_attention_v2, static, outs)
    for inputs in (first, second):
        dev = _to_device(inputs, "cuda")
        for name in ("query", "key_cache", "value_cache", "block_tables", "seq_lens"):
            getattr(static, name).copy_(getattr(dev, name))
        static.alibi_slopes.copy_(dev.alibi_slopes)
        graph.replay()
        torch.cuda.synchronize()
        want = testing.call_v2(reference.paged_attention_v2, inputs,
                               testing.alloc_v2_outputs(inputs, max_num_partitions=3))
        got = testing.V2Outputs(*(t.cpu() for t in outs))
        testing.assert_v2_matches(got, want, inputs.seq_lens_list, inputs.dtype,
                                  inputs.kv_cache_dtype)


@pytest.mark.parametrize("block_size,seq_lens", [(3, [1528]), (3, [1536, 2]), (5, [2047]),
                                                 (6, [1025, 1100])])
def test_block_size_not_dividing_the_partition(block_size, seq_lens):
    # Regression (found by tests/test_fuzz.py): a chunk of several partitions can be whole blocks
    # (3 x 512 tokens = 512 blocks of 3) without each partition being whole blocks.
    inputs = testing.make_attention_inputs(len(seq_lens), 2, 1, 8, block_size, seq_lens,
                                           dtype=torch.bfloat16, seed=31)
    conformance.require(conformance.v1(FALLBACK, inputs))  # against the oracle's v1
    _check(inputs)
