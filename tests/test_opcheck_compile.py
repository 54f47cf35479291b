"""The ops behave like well-made PyTorch custom ops: torch.library.opcheck (schema, fake tensor,
functionalization, AOT dispatch) and torch.compile(fullgraph=True), on whatever implementation is
registered for the CPU."""

import dataclasses

import pytest
import torch

from paged_attention_ext import reference, testing


def _v2_args(inputs):
    outputs = testing.alloc_v2_outputs(inputs, fill=0.0)
    return (*outputs, *testing._attention_args(inputs))


@pytest.mark.parametrize("scale_as_tensor", [False, True])
@pytest.mark.parametrize("op_name", ["v1", "v2"])
def test_opcheck_attention(op_name, scale_as_tensor):
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [5, 530], kv_cache_dtype="fp8_e4m3",
                                           use_alibi=True, scale_as_tensor=scale_as_tensor,
                                           seed=11)
    if op_name == "v1":
        args = (testing.alloc_v1_outputs(inputs, fill=0.0), *testing._attention_args(inputs))
    else:
        args = _v2_args(inputs)
    overload = "scale_tensor" if scale_as_tensor else "default"
    op = getattr(getattr(torch.ops.paged_attn, op_name), overload)
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_opcheck_reshape_and_cache(scale_as_tensor):
    inputs = testing.make_attention_inputs(1, 4, 2, 32, 8, [20], seed=12)
    key = torch.randn(6, 2, 32)
    value = torch.randn(6, 2, 32)
    slots = torch.tensor([3, -1, 0, 17, 9, 23], dtype=torch.int64)
    scale = torch.tensor(1.0) if scale_as_tensor else 1.0
    overload = "scale_tensor" if scale_as_tensor else "default"
    op = getattr(torch.ops.paged_attn.reshape_and_cache, overload)
    torch.library.opcheck(op, (key, value, inputs.key_cache.clone(), inputs.value_cache.clone(),
                               slots, "auto", scale, scale))


def _decode_step(key, value, key_cache, value_cache, slot_mapping, query, block_tables, seq_lens,
                 out, exp_sums, max_logits, tmp_out, max_seq_len: int):
    """One decode step as a serving loop runs it: append the new K/V, then attend."""
    torch.ops.paged_attn.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                           "auto", 1.0, 1.0)
    torch.ops.paged_attn.v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                            key_cache.size(1), query.size(-1) ** -0.5, block_tables, seq_lens,
                            key_cache.size(3), max_seq_len, None, "auto", 1.0, 1.0)
    return out * 2  # something after the op, so the graph uses its result


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    torch._dynamo.reset()
    inputs = testing.make_attention_inputs(2, 8, 2, 64, 16, [40, 700], dtype=torch.bfloat16,
                                           seed=13)
    # the new token of each sequence goes to the last slot of its row
    slots = []
    for s, n in enumerate(inputs.seq_lens_list):
        block = int(inputs.block_tables[s, (n - 1) // 16])
        slots.append(block * 16 + (n - 1) % 16)
    new_kv = torch.randn(2, 2, 2, 64, dtype=torch.bfloat16)

    def run(fn):
        kc, vc = inputs.key_cache.clone(), inputs.value_cache.clone()
        outputs = testing.alloc_v2_outputs(inputs)
        result = fn(new_kv[0], new_kv[1], kc, vc, torch.tensor(slots), inputs.query,
                    inputs.block_tables, inputs.seq_lens, *outputs, inputs.max_seq_len)
        return result, outputs.out, kc

    eager = run(_decode_step)
    compiled = run(torch.compile(_decode_step, fullgraph=True, dynamic=dynamic))
    for got, want in zip(compiled, eager):
        torch.testing.assert_close(got, want, equal_nan=True)
    # and the eager result is right: the oracle on a cache updated by the oracle
    kc, vc = inputs.key_cache.clone(), inputs.value_cache.clone()
    reference.reshape_and_cache(new_kv[0], new_kv[1], kc, vc, torch.tensor(slots))
    ref_inputs = dataclasses.replace(inputs, key_cache=kc, value_cache=vc)
    expected = testing.call_v2(reference.paged_attention_v2, ref_inputs,
                               testing.alloc_v2_outputs(ref_inputs))
    testing.assert_out_matches(eager[1], expected.out, inputs.dtype)
