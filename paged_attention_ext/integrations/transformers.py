"""Decode a Hugging Face transformers causal LM with its KV cache in this project's paged layout.

How it plugs in (transformers' own extension points; nothing in transformers is patched):
  - Importing this module registers the attention function "paged_attn" with
    `transformers.AttentionInterface`. A model loaded with `attn_implementation="paged_attn"`
    (or switched with `model.set_attn_implementation("paged_attn")` in transformers versions
    that have it) calls it in every layer.
  - The model runs with `use_cache=False`, so transformers keeps no cache of its own: the KV
    cache is a `PagedKVCache`. Each forward gets the step's metadata as the keyword argument
    `paged_step`, which transformers forwards untouched to the attention function.
  - Per layer and step, the attention function writes this step's K/V (after RoPE) into the
    layer's paged cache with `torch.ops.paged_attn.reshape_and_cache`, then
      prefill (q_len > 1, fresh sequences): causal attention over the prompt's own K/V with
        transformers' sdpa function (the model's own prefill path);
      decode (q_len == 1; sequences of different lengths batched): `torch.ops.paged_attn.v1`
        or `v2` (api.choose_version) over the paged cache.
  - `generate_greedy(model, prompts, max_new_tokens)` drives it: prefill each prompt, then
    decode all sequences together, one token per step.

CONTINUOUS_BATCHING, also exported here, is the other route: transformers' own continuous
batching (`model.generate_batch`, `transformers serve`) with decode in the paged ops on
transformers' own cache (transformers_continuous_batching.py; docs/INTEGRATIONS.md says which
route fits what).

The ops are whatever backend is active for the device (the compiled CPU / CUDA kernels, else the
PyTorch implementation). ALiBi: `alibi_slopes` is honoured by both paths, but no ALiBi model in
transformers (Bloom, MPT, Falcon) computes attention through the AttentionInterface, so no
transformers model can use it yet (docs/INTEGRATIONS.md).
"""

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import transformers

if not hasattr(transformers, "AttentionInterface"):  # absent in 4.50; 4.53 is the oldest tested
    raise ImportError(f"paged_attention_ext.integrations.transformers needs transformers>=4.53 "
                      f"(transformers.AttentionInterface); found {transformers.__version__}")

from .. import op_args  # noqa: E402
from ..api import choose_version  # noqa: E402
from .paged_kv_cache import PagedKVCache, StepMetadata  # noqa: E402

ATTN_IMPLEMENTATION = "paged_attn"

__all__ = ["ATTN_IMPLEMENTATION", "CONTINUOUS_BATCHING", "GreedyOutput", "PagedKVCache",
           "generate_greedy", "paged_attention_forward", "register"]


# ---- the attention function ----

def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: Optional[torch.Tensor],
                            scaling: Optional[float] = None, dropout: float = 0.0,
                            paged_step: Optional[StepMetadata] = None, **kwargs):
    """transformers attention function over a paged KV cache.

    query [batch, num_heads, q_len, head_size]; key, value [batch, num_kv_heads, q_len,
    head_size]: this step's tokens only. attention_mask is ignored (transformers builds none
    for a custom implementation; the lengths come from paged_step).
    Returns (out [batch, q_len, num_heads, head_size], None), as transformers expects.
    """
    if paged_step is None:
        raise ValueError(
            f"attn_implementation {ATTN_IMPLEMENTATION!r} needs the keyword argument paged_step "
            "(a PagedKVCache step): generate with paged_attention_ext.integrations.transformers."
            "generate_greedy, or pass paged_step=cache.prepare_step(...) to the model")
    _refuse_unsupported(module, dropout, paged_step, kwargs)
    batch, num_heads, q_len, head_size = query.shape
    num_kv_heads = key.shape[1]
    scale = head_size ** -0.5 if scaling is None else scaling
    key_cache, value_cache = paged_step.cache.layers[module.layer_idx]

    # [batch, num_kv_heads, q_len, head_size] -> [batch * q_len, num_kv_heads, head_size]:
    # token order (sequence-major) matches paged_step.slot_mapping.
    new_keys = key.transpose(1, 2).reshape(-1, num_kv_heads, head_size)
    new_values = value.transpose(1, 2).reshape(-1, num_kv_heads, head_size)
    # .default named: float scales (the packet would resolve to it, one Python step later)
    torch.ops.paged_attn.reshape_and_cache.default(new_keys, new_values, key_cache, value_cache,
                                                   paged_step.slot_mapping, "auto", 1.0, 1.0)
    if q_len == 1:
        out = _decode(query[:, :, 0, :], key_cache, value_cache, num_kv_heads, scale, paged_step)
        return out.unsqueeze(1), None
    return _prefill(module, query, key, value, scale, paged_step), None


def _refuse_unsupported(module, dropout, step, kwargs):
    """Attention variants the paged ops do not compute: an error, never a silently wrong output.
    A sliding window no sequence reaches yet changes nothing and is allowed."""
    problem = None
    window = kwargs.get("sliding_window")
    if dropout:
        problem = "dropout (inference only)"
    elif window is not None and step.max_seq_len > window:
        problem = f"a sliding window ({window} tokens) shorter than a sequence ({step.max_seq_len})"
    elif kwargs.get("softcap") is not None:
        problem = "attention logit soft-capping"
    elif getattr(module, "sinks", None) is not None or kwargs.get("s_aux") is not None:
        problem = "attention sinks"
    if problem:
        raise ValueError(f"{ATTN_IMPLEMENTATION}: {problem} is not supported by the paged ops")


def _decode(query, key_cache, value_cache, num_kv_heads, scale, step):
    """query [num_seqs, num_heads, head_size] (a strided view: the ops take any stride on dims
    0 and 1) -> out [num_seqs, num_heads, head_size], attending over seq_lens tokens each."""
    if any(n != 1 for n in step.query_lens) or len(step.query_lens) != query.shape[0]:
        raise ValueError(f"{ATTN_IMPLEMENTATION}: a decode step needs one new token per "
                         f"sequence (got query_lens {step.query_lens})")
    num_seqs, num_heads, head_size = query.shape
    version = step.version
    if version == "auto":
        version = choose_version(query.device, step.max_seq_len, num_seqs, num_heads,
                                 step.block_tables.size(1) * key_cache.size(3))
    out = torch.empty(num_seqs, num_heads, head_size, dtype=query.dtype, device=query.device)
    args = op_args.V1Args(out, query, key_cache, value_cache, num_kv_heads, scale,
                          step.block_tables, step.seq_lens, key_cache.size(3), step.max_seq_len,
                          step.alibi_slopes)  # the rest: the schema's defaults
    if version == "v2":
        args = op_args.with_scratch(args, *step.v2_scratch(num_heads, head_size, query.dtype))
    op_args.call_op(version, args)
    return out


def _prefill(module, query, key, value, scale, step):
    """Causal attention of fresh prompts over their own K/V (no earlier context). All
    sequences of the batch have q_len tokens (no padding). Returns [batch, q_len, heads, d]."""
    q_len = query.shape[2]
    if any(n != q_len for n in step.query_lens) or step.max_seq_len != q_len:
        raise ValueError(f"{ATTN_IMPLEMENTATION}: prefill supports fresh, unpadded prompts of "
                         f"one length per batch (query_lens {step.query_lens}, max_seq_len "
                         f"{step.max_seq_len}); prefill prompts of other lengths separately")
    if step.alibi_slopes is None:
        sdpa = transformers.AttentionInterface()["sdpa"]  # the model's own prefill attention
        out, _ = sdpa(module, query, key, value, None, scaling=scale, is_causal=True)
        return out
    # ALiBi: bias slope[h] * (j - i) for key j <= query i, -inf above the diagonal.
    positions = torch.arange(q_len, device=query.device)
    distance = (positions[None, :] - positions[:, None]).float()  # [q_len, q_len]: j - i
    bias = step.alibi_slopes[:, None, None] * distance  # [num_heads, q_len, q_len]
    bias = bias.masked_fill(distance > 0, float("-inf")).to(query.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=bias, scale=scale,
        enable_gqa=query.shape[1] != key.shape[1])  # [batch, heads, q_len, d]
    return out.transpose(1, 2).contiguous()


def register() -> None:
    """Register "paged_attn" with transformers.AttentionInterface (idempotent; done on import)."""
    transformers.AttentionInterface.register(ATTN_IMPLEMENTATION, paged_attention_forward)


register()

# transformers' own continuous batching through the paged ops (its module registers it on import).
from .transformers_continuous_batching import CONTINUOUS_BATCHING  # noqa: E402


# ---- the decode driver ----

@dataclass
class GreedyOutput:
    tokens: torch.Tensor  # int64 [num_seqs, max_new_tokens]
    logits: torch.Tensor  # float32 [max_new_tokens, num_seqs, vocab_size]: what chose each token


def _model_geometry(model):
    """(num_layers, num_kv_heads, head_size) of a decoder-only transformers model."""
    config = model.config.get_text_config()
    head_size = (getattr(config, "head_dim", None)
                 or config.hidden_size // config.num_attention_heads)
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return config.num_hidden_layers, num_kv_heads, head_size


@torch.inference_mode()
def generate_greedy(model, prompts: Sequence[torch.Tensor], max_new_tokens: int, *,
                    block_size: int = 16, num_blocks: Optional[int] = None,
                    version: str = "auto", seed: Optional[int] = None, poison: bool = False,
                    alibi_slopes: Optional[torch.Tensor] = None) -> GreedyOutput:
    """Greedy decoding of `max_new_tokens` tokens for each prompt (int64 [prompt_len] token
    ids), KV cache paged: each prompt is prefilled alone, then all sequences decode together,
    their different lengths batched in one paged op call per layer and step.

    num_blocks: pool size (default: what the prompts and new tokens need, twice over, so that
      shuffled blocks scatter). seed: shuffle the free block list (None: blocks in order).
    poison: fill the pool with NaN first (slots nobody wrote must never reach the output).
    version: "v1", "v2" or "auto" (api.choose_version). No EOS handling: exactly max_new_tokens
      each.
    """
    if model.config._attn_implementation != ATTN_IMPLEMENTATION:
        raise ValueError(
            f"generate_greedy: the model's attn_implementation is "
            f"{model.config._attn_implementation!r}; load it with attn_implementation="
            f"{ATTN_IMPLEMENTATION!r} or call model.set_attn_implementation("
            f"{ATTN_IMPLEMENTATION!r}) first")
    if max_new_tokens < 1 or not prompts or any(p.dim() != 1 or p.numel() == 0 for p in prompts):
        raise ValueError("generate_greedy: needs max_new_tokens >= 1 and non-empty 1-D prompts")
    num_layers, num_kv_heads, head_size = _model_geometry(model)
    device = model.device
    if num_blocks is None:
        num_blocks = 2 * sum(-(-(p.numel() + max_new_tokens) // block_size) for p in prompts)
    cache = PagedKVCache(num_layers, num_kv_heads, head_size, num_blocks, block_size,
                         model.dtype, device, seed=seed, poison=poison)
    seq_ids = [cache.add_sequence() for _ in prompts]

    def forward(input_ids, positions, step):  # -> float32 [num_seqs, vocab]: last token's logits
        out = model(input_ids=input_ids, position_ids=positions, use_cache=False,
                    paged_step=step, logits_to_keep=1)
        return out.logits[:, -1, :].float()

    first = []
    for seq_id, prompt in zip(seq_ids, prompts):  # prefill, one prompt at a time
        step = cache.prepare_step([seq_id], [prompt.numel()], alibi_slopes=alibi_slopes,
                                  version=version)
        positions = torch.arange(prompt.numel(), device=device)[None]
        first.append(forward(prompt.to(device)[None], positions, step))
    logits = torch.cat(first)

    all_tokens, all_logits = [], []
    for i in range(max_new_tokens):
        tokens = logits.argmax(dim=-1)  # [num_seqs]
        all_tokens.append(tokens)
        all_logits.append(logits)
        if i + 1 == max_new_tokens:
            break
        step = cache.prepare_step(seq_ids, [1] * len(seq_ids), alibi_slopes=alibi_slopes,
                                  version=version)
        positions = (step.seq_lens.long() - 1)[:, None]  # the new token's position
        logits = forward(tokens[:, None], positions, step)
    return GreedyOutput(torch.stack(all_tokens, dim=1), torch.stack(all_logits))
