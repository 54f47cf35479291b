"""Integrations of the paged ops into model code.

- `paged_kv_cache`: a framework-free paged KV pool (one key/value cache pair per layer in this
  project's layout), a block allocator handing out shuffled blocks, and the per-step metadata
  (slot_mapping, block_tables, seq_lens) the ops take.
- `transformers`: runs a Hugging Face transformers causal LM's decode with its KV cache in that
  pool; attention goes through `torch.ops.paged_attn.*` via transformers' AttentionInterface.
  It also exports CONTINUOUS_BATCHING, from
- `transformers_continuous_batching`: an attention implementation for transformers' own
  continuous batching (generate_batch, transformers serve), whose FlashAttention API
  (`transformers_flash`) decodes with the paged ops on transformers' paged cache.
  Those need the optional `transformers` dependency; nothing here imports it until one is used.
- `vllm_compat`: functions with vLLM's `_custom_ops` names and signatures (and the seed's
  `paged_attention_v2_pytorch`) over `torch.ops.paged_attn.*`.
- `vllm_plugin`: the `vllm.general_plugins` entry point that installs those functions in
  `vllm._custom_ops` where vLLM's own are missing or stubs.
"""
