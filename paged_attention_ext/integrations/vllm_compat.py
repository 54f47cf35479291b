"""Drop-in functions with vLLM's `_custom_ops` names and the seed's exact Python signature, each a
call of `torch.ops.paged_attn.*` (whichever backend is active for the tensors' device).

A vLLM (or fork) whose `_custom_ops.paged_attention_v1 / v2 / reshape_and_cache` are missing or
raise NotImplementedError gets these functions from the package's vLLM plugin
(`integrations/vllm_plugin.py`, loaded by vLLM in each of its processes), with no edit to vLLM.
Code that is not vLLM calls them directly:

    from paged_attention_ext.integrations.vllm_compat import (
        paged_attention_v1, paged_attention_v2, reshape_and_cache, reshape_and_cache_flash)

or, keeping its own function: `return paged_attention_v2_pytorch(out, exp_sum, ...)`.

k_scale / v_scale may be Python floats (the seed) or 1-element float32 tensors (current vLLM);
the ops pick the matching overload. Unlike the seed, the output is correct for every length
(the seed combined unnormalised partition sums as if normalised: docs/CONTRACT.md).
"""

import torch  # noqa: F401  (importing the package registers torch.ops.paged_attn)

from .. import op_args

# The seed's names for v2's output and scratch (the schema's `out` and `tmp_out`), and vLLM's
# (`exp_sum` for the schema's `exp_sums`): callers pass them by keyword too.
_SEED_V2_ARGS = op_args.record_type("v2", rename={"out": "output", "tmp_out": "tmp_output"})
_VLLM_V2_ARGS = op_args.record_type("v2", rename={"exp_sums": "exp_sum"})

# Each function: the op's arguments (schemas.py's order and defaults, k_scale / v_scale floats or
# 1-element float32 tensors), shapes as docs/CONTRACT.md says, handed to torch.ops.paged_attn.
paged_attention_v2_pytorch = op_args.function(
    "v2", op_args.call_op, "The seed's function, computed by torch.ops.paged_attn.v2 (writes "
    "output and scratch).", record=_SEED_V2_ARGS, name="paged_attention_v2_pytorch",
    module=__name__)

paged_attention_v2 = op_args.function(
    "v2", op_args.call_op, "vLLM's _custom_ops.paged_attention_v2 (its argument names), computed "
    "by torch.ops.paged_attn.v2.", record=_VLLM_V2_ARGS, name="paged_attention_v2",
    module=__name__)

paged_attention_v1 = op_args.function(
    "v1", op_args.call_op, "vLLM's _custom_ops.paged_attention_v1, computed by "
    "torch.ops.paged_attn.v1.", module=__name__)

reshape_and_cache = op_args.function(
    "reshape_and_cache", op_args.call_op, "vLLM's _custom_ops.reshape_and_cache, computed by "
    "torch.ops.paged_attn.reshape_and_cache.", module=__name__)

reshape_and_cache_flash = op_args.function(
    "reshape_and_cache_flash", op_args.call_op, "vLLM's _custom_ops.reshape_and_cache_flash "
    "(NHD-ordered caches; an HND one as cache.transpose(1, 2)), computed by "
    "torch.ops.paged_attn.reshape_and_cache_flash.", module=__name__)
