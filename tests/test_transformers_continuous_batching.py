"""transformers' own continuous batching (model.generate_batch) with attn_implementation
CONTINUOUS_BATCHING: decode steps through torch.ops.paged_attn.decode on transformers' paged
cache, against transformers' generate() with sdpa on the same weights.

Models: tiny random Llama (hidden 64, 2 layers; GQA and MHA), initializer_range 0.08 so that
attention is sharp (a wrong block lookup or a misplaced token changes the output). Prompts of 5 to
530 tokens in one batch, page_size 16: from one page to 34, and past 512 tokens (the ops' partition
size). Two schedules: every prompt prefilled in the first batch then decode-only batches (each
decode step asserted to reach our op with the right lengths), and chunked prefill (a 64-token
batch budget) mixing prefill chunks with other sequences' decode tokens. A sliding-window model
(Qwen2, one sliding layer), which transformers keeps off the block-table path, runs too.

The FlashAttention API functions behind it (integrations/transformers_flash.py) are checked
against float64 dense attention on NaN-poisoned, shuffled paged caches.
"""

import copy

import pytest
import torch
from support.op_calls import OpCalls

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install "
    "'paged_attention_ext[transformers]')")

from paged_attention_ext.integrations import transformers_continuous_batching as tcb  # noqa: E402
from paged_attention_ext.integrations import transformers_flash as flash  # noqa: E402

if not tcb.is_supported():
    pytest.skip(f"CONTINUOUS_BATCHING needs transformers in {tcb.SUPPORTED_TRANSFORMERS}, found "
                f"{transformers.__version__}", allow_module_level=True)

from paged_attention_ext.integrations.transformers import CONTINUOUS_BATCHING  # noqa: E402
from paged_attention_ext.tools.testing import make_decode_inputs  # noqa: E402

VOCAB = 512
PROMPT_LENS = (5, 23, 150, 530)
NEW_TOKENS = 10
PAGE_SIZE = 16
GEOMETRIES = {"gqa": (4, 2), "mha": (4, 4)}  # name: (num_heads, num_kv_heads), head_size 16
_MODELS = {}


def _model(name):
    """fp32 LlamaForCausalLM, sdpa, random weights seeded by the geometry."""
    if name not in _MODELS:
        num_heads, num_kv_heads = GEOMETRIES[name]
        config = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=16,
            max_position_embeddings=1024, initializer_range=0.08, bos_token_id=None,
            eos_token_id=None, pad_token_id=None)
        torch.manual_seed(99 + num_kv_heads)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        _MODELS[name] = model.eval()
    return _MODELS[name]


def _prompts():
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]


def _generation_config():
    return transformers.GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False,
                                         eos_token_id=None, pad_token_id=0)


@torch.inference_mode()
def _generate_reference(model, prompts):
    """transformers' generate() with sdpa, one prompt at a time: [num_prompts][NEW_TOKENS]."""
    return [model.generate(torch.tensor([p]), generation_config=_generation_config())[0, len(p):]
            .tolist() for p in prompts]


def _generate_batch(model, prompts, max_batch_tokens, attn_implementation):
    """model.generate_batch as a user calls it; tokens in prompt order."""
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn_implementation)
    cb_config = transformers.ContinuousBatchingConfig(
        page_size=PAGE_SIZE, num_blocks=160, max_batch_tokens=max_batch_tokens)
    results = model.generate_batch(prompts, generation_config=_generation_config(),
                                   continuous_batching_config=cb_config, progress_bar=False)
    assert len(results) == len(prompts)
    order = sorted(results, key=lambda request_id: int(request_id.rsplit("_", 1)[1]))
    return [list(results[request_id].generated_tokens) for request_id in order]


def _decode_record(out, query, key_cache, value_cache, block_tables, seq_lens, *rest):
    return {"seq_lens": sorted(seq_lens.tolist()), "key_cache": key_cache,
            "value_cache": value_cache}


def _write_record(key, value, key_cache, value_cache, slot_mapping, *rest):
    return {"num_slots": slot_mapping.numel(), "key_cache": key_cache}


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_decode_steps_run_through_the_op_on_transformers_cache(paged_ops, name, monkeypatch):
    model, prompts = _model(name), _prompts()
    reference = _generate_reference(model, prompts)
    decodes = OpCalls(monkeypatch, "decode", _decode_record)
    writes = OpCalls(monkeypatch, "reshape_and_cache_flash", _write_record)

    # A batch budget above the prompts' total: one prefill batch, then decode-only batches.
    tokens = _generate_batch(model, prompts, 1024, CONTINUOUS_BATCHING)
    assert tokens == reference

    # Every decode step of every layer went through decode, with each sequence's length.
    num_layers = model.config.num_hidden_layers
    steps = [sorted(n + s for n in PROMPT_LENS) for s in range(1, NEW_TOKENS)]
    assert [call["seq_lens"] for call in decodes.calls] == [
        lens for lens in steps for _ in range(num_layers)]
    assert [call["num_slots"] for call in writes.calls] == [len(prompts)] * len(decodes.calls)

    # On transformers' cache as it is: K and V of a layer are page views of one buffer that
    # holds every layer's K and V pages (a per-step copy would hold one layer's K or V only).
    for call in decodes.calls:
        k_cache, v_cache = call["key_cache"], call["value_cache"]
        assert k_cache.shape[1] == PAGE_SIZE and k_cache.is_contiguous()
        assert k_cache.untyped_storage().data_ptr() == v_cache.untyped_storage().data_ptr()
        page_bytes = k_cache[0].numel() * k_cache.element_size()
        assert v_cache.storage_offset() - k_cache.storage_offset() == k_cache[0].numel()
        assert k_cache.untyped_storage().nbytes() >= 2 * num_layers * 160 * page_bytes
    storages = {call["key_cache"].untyped_storage().data_ptr() for call in decodes.calls}
    assert len(storages) == 1
    assert all(w["key_cache"].untyped_storage().data_ptr() in storages for w in writes.calls)


@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_chunked_prefill_and_mixed_batches(paged_ops, name, monkeypatch):
    model, prompts = _model(name), _prompts()
    decodes = OpCalls(monkeypatch, "decode", _decode_record)
    # 64 tokens per batch: the long prompts are prefilled in chunks, next to decode tokens.
    tokens = _generate_batch(model, prompts, 64, CONTINUOUS_BATCHING)
    assert tokens == _generate_reference(model, prompts)
    assert decodes.calls, "no decode-only batch reached torch.ops.paged_attn.decode"


def test_prefix_sharing(paged_ops, monkeypatch):
    """Prompts sharing a 70-token prefix, prefilled in 40-token batches: later requests reuse
    the first one's complete pages (transformers' prefix sharing), and decode reads them."""
    from transformers.generation.continuous_batching.cache import PagedAttentionCache

    model = _model("gqa")
    gen = torch.Generator().manual_seed(8)
    prefix = torch.randint(1, VOCAB, (70,), generator=gen).tolist()
    prompts = [prefix + torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in (3, 40)]
    prompts.append(prefix)
    matched = []
    search = PagedAttentionCache.search_prefix_match

    def recorded_search(self, request_id, prompt_ids):
        matched.append(search(self, request_id, prompt_ids))
        return matched[-1]

    monkeypatch.setattr(PagedAttentionCache, "search_prefix_match", recorded_search)
    decodes = OpCalls(monkeypatch, "decode", _decode_record)
    assert _generate_batch(model, prompts, 40, CONTINUOUS_BATCHING) == _generate_reference(
        model, prompts)
    assert max(matched) >= 4 * PAGE_SIZE, f"no prefix shared: {matched}"
    assert decodes.calls


def _sliding_window_model():
    """Qwen2 with a sliding-window layer (window 8) under a full-attention one: the first
    layer's prefill output is cached as the second layer's K/V, so a window ignored in prefill
    changes every later step."""
    if "sliding" not in _MODELS:
        config = transformers.Qwen2Config(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=1024, initializer_range=0.08, use_sliding_window=True,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"],
            bos_token_id=None, eos_token_id=None, pad_token_id=None)
        assert config.layer_types == ["sliding_attention", "full_attention"]
        torch.manual_seed(7)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        _MODELS["sliding"] = model.eval()
    return _MODELS["sliding"]


@pytest.mark.parametrize("max_batch_tokens", [1024, 64])
def test_sliding_window_model(paged_ops, max_batch_tokens, monkeypatch):
    """transformers keeps sliding-window models off the block-table path: every step is
    flash_attn_varlen_func's, with the window applied; tokens are generate()'s."""
    model, prompts = _sliding_window_model(), _prompts()[:3]
    decodes = OpCalls(monkeypatch, "decode", _decode_record)
    assert (_generate_batch(model, prompts, max_batch_tokens, CONTINUOUS_BATCHING)
            == _generate_reference(model, prompts))
    assert decodes.calls == []


def test_other_implementations_unchanged(paged_ops, monkeypatch):
    """sdpa continuous batching still runs transformers' own path (no call to our ops)."""
    model, prompts = _model("gqa"), _prompts()[:2]
    decodes = OpCalls(monkeypatch, "decode", _decode_record)
    assert _generate_batch(model, prompts, 1024, "sdpa") == _generate_reference(model, prompts)
    assert decodes.calls == []


def test_generate_with_the_implementation(paged_ops):
    """A model loaded with attn_implementation=CONTINUOUS_BATCHING; generate() (no continuous
    batching): flash_attn_func, and flash_attn_varlen_func for a left-padded batch, give sdpa's
    tokens."""
    model = _model("gqa")
    ours = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(model.config), attn_implementation=CONTINUOUS_BATCHING)
    ours.load_state_dict(model.state_dict())
    ours.eval()
    assert ours.config._attn_implementation == CONTINUOUS_BATCHING
    prompts = [torch.tensor(p) for p in _prompts()[:3]]
    config = _generation_config()
    for prompt in prompts:
        assert torch.equal(ours.generate(prompt[None], generation_config=config),
                           model.generate(prompt[None], generation_config=config))
    width = max(p.numel() for p in prompts)
    ids = torch.stack([torch.cat([p.new_zeros(width - p.numel()), p]) for p in prompts])
    mask = torch.stack([torch.arange(width) >= width - p.numel() for p in prompts]).long()
    assert torch.equal(ours.generate(ids, attention_mask=mask, generation_config=config),
                       model.generate(ids, attention_mask=mask, generation_config=config))


def test_decode_path_enabled_for_this_implementation_only():
    from transformers.generation.continuous_batching import initialization

    for implementation, expected, graphs in ((CONTINUOUS_BATCHING, 32, (False, False)),
                                             ("sdpa", 0, None)):
        config = copy.deepcopy(_model("gqa").config)
        config._attn_implementation_internal = implementation
        cb_config = transformers.ContinuousBatchingConfig(max_blocks_per_request=32)
        initialization.ensure_decode_fast_path_is_available(config, cb_config, False)
        assert cb_config.max_blocks_per_request == expected
        assert cb_config.use_cuda_graph == graphs
    # Graphs the user asks for are kept.
    config._attn_implementation_internal = CONTINUOUS_BATCHING
    cb_config = transformers.ContinuousBatchingConfig(use_cuda_graph=(False, True))
    initialization.ensure_decode_fast_path_is_available(config, cb_config, False)
    assert cb_config.use_cuda_graph == (False, True)
    # A sliding-window layer keeps transformers' refusal of the block-table path.
    config = transformers.MistralConfig(hidden_size=64, intermediate_size=128,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, sliding_window=32)
    config._attn_implementation_internal = CONTINUOUS_BATCHING
    cb_config = transformers.ContinuousBatchingConfig(max_blocks_per_request=32)
    initialization.ensure_decode_fast_path_is_available(config, cb_config, False)
    assert cb_config.max_blocks_per_request == 0


def test_supported_versions(monkeypatch):
    assert tcb.is_supported("5.24.0") and tcb.is_supported("5.24.3.dev0")
    assert not tcb.is_supported("5.25.0") and not tcb.is_supported("4.57.1")
    assert tcb.register()  # idempotent on this (supported) version
    monkeypatch.setattr(tcb, "is_supported", lambda: False)
    with pytest.warns(UserWarning, match="needs transformers>=5.24,<5.25"):
        assert tcb.register() is False


# ---- the FlashAttention API functions against float64 dense attention ----

def _dense_causal(q, k, v, scale, window=None):
    """float64. q [q_len, H, d]; k, v [k_len, Hkv, d]; bottom-right causal, and with `window`
    each query sees its last `window` positions only -> [q_len, H, d]."""
    q_len, k_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    logits = scale * torch.einsum("qhd,khd->hqk", q.double(), k)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    if window is not None:
        allowed &= ~torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len - window)
    logits = logits.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", logits.softmax(-1), v)


def _gather_nhd(cache, block_table, n):
    """[n, Hkv, d]: the first n tokens of a sequence from an NHD paged cache."""
    t = torch.arange(n)
    return cache[block_table[t // cache.shape[1]].long(), t % cache.shape[1]]


@pytest.mark.parametrize("num_heads,num_kv_heads,block_size", [(8, 2, 16), (4, 4, 8)])
def test_flash_attn_with_kvcache_against_dense(paged_ops, num_heads, num_kv_heads, block_size):
    seq_lens = [1, 17, 530, 64]  # after appending the new token; the last row is padding
    inputs = make_decode_inputs(4, num_heads, num_kv_heads, 32, block_size, seq_lens,
                                layout="nhd", seed=11)
    gen = torch.Generator().manual_seed(12)
    k_new, v_new = (torch.randn(4, 1, num_kv_heads, 32, generator=gen) for _ in range(2))
    cache_seqlens = torch.tensor([n - 1 for n in seq_lens], dtype=torch.int32)
    cache_seqlens[3] = -1  # a padding sequence: nothing written, zero output
    k_before = inputs.key_cache.clone()
    out = flash.flash_attn_with_kvcache(
        inputs.query[:, None], inputs.key_cache, inputs.value_cache, k_new, v_new,
        cache_seqlens=cache_seqlens, block_table=inputs.block_tables, softmax_scale=inputs.scale,
        causal=True)
    assert out.shape == (4, 1, num_heads, 32)
    for s in range(3):
        n = seq_lens[s]
        keys = _gather_nhd(inputs.key_cache, inputs.block_tables[s], n)
        values = _gather_nhd(inputs.value_cache, inputs.block_tables[s], n)
        assert torch.equal(keys[-1], k_new[s, 0]) and torch.equal(values[-1], v_new[s, 0])
        expected = _dense_causal(inputs.query[s, None], keys, values, inputs.scale)[0]
        torch.testing.assert_close(out[s, 0].double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    written = (inputs.key_cache != k_before) & ~(inputs.key_cache.isnan() & k_before.isnan())
    assert written.any(dim=(2, 3)).sum() == 3  # one slot per real sequence, none for padding


@pytest.mark.parametrize("window", [None, 9])
def test_flash_attn_varlen_func_against_dense(window):
    gen = torch.Generator().manual_seed(3)
    q_lens, k_lens = [7, 1, 0, 40, 20], [7, 30, 5, 600, 20]  # prefill, decode, empty, chunk
    q = torch.randn(sum(q_lens) + 2, 8, 16, generator=gen)  # 2 padding rows at the end
    k, v = (torch.randn(sum(k_lens), 2, 16, generator=gen) for _ in range(2))
    cu_q = torch.tensor([0] + q_lens).cumsum(0).int()
    cu_k = torch.tensor([0] + k_lens).cumsum(0).int()
    # transformers' window_size for a window of w tokens: (w - 1, w - 1)
    window_size = (-1, -1) if window is None else (window - 1, window - 1)
    out = flash.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                       softmax_scale=0.3, causal=True, window_size=window_size)
    for s in range(len(q_lens)):
        qs, ks = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        if q_lens[s]:
            expected = _dense_causal(q[qs], k[ks], v[ks], 0.3, window)
            torch.testing.assert_close(out[qs].double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))


def test_flash_attn_func_against_dense():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 6, 4, 16, generator=gen)
    k, v = (torch.randn(2, 25, 2, 16, generator=gen) for _ in range(2))
    out = flash.flash_attn_func(q, k, v, softmax_scale=0.25, causal=True, window_size=(7, 7))
    for b in range(2):
        torch.testing.assert_close(out[b].double(), _dense_causal(q[b], k[b], v[b], 0.25, 8),
                                   rtol=1e-5, atol=1e-5)


_UNSUPPORTED = ({"s_aux": torch.zeros(4)}, {"dropout_p": 0.1})


@pytest.mark.parametrize("function,unsupported", [
    *(("varlen", u) for u in _UNSUPPORTED), *(("dense", u) for u in _UNSUPPORTED),
    # FlashAttention's kvcache API has no dropout; paged_attn.decode has no window
    ("kvcache", {"s_aux": torch.zeros(4)}), ("kvcache", {"window_size": (31, 31)}),
])
def test_unsupported_features_are_refused(function, unsupported):
    q = torch.randn(2, 1, 4, 16)
    k = torch.randn(2, 1, 2, 16)
    if function == "kvcache":
        cache = torch.zeros(4, 16, 2, 16)
        call = lambda: flash.flash_attn_with_kvcache(  # noqa: E731
            q, cache, cache, k, k, cache_seqlens=torch.tensor([0, 1], dtype=torch.int32),
            block_table=torch.tensor([[0], [1]], dtype=torch.int32), **unsupported)
    elif function == "varlen":
        cu = torch.tensor([0, 1, 2], dtype=torch.int32)
        call = lambda: flash.flash_attn_varlen_func(  # noqa: E731
            q[:, 0], k[:, 0], k[:, 0], cu, cu, 1, 1, **unsupported)
    else:
        call = lambda: flash.flash_attn_func(q, k, k, **unsupported)  # noqa: E731
    with pytest.raises(ValueError, match="does not support"):
        call()


def test_kvcache_needs_the_paged_decode_arguments():
    q = torch.randn(2, 1, 4, 16)
    cache = torch.zeros(4, 16, 2, 16)
    with pytest.raises(ValueError, match="block_table"):
        flash.flash_attn_with_kvcache(q, cache, cache)
    with pytest.raises(ValueError, match="one new token"):
        flash.flash_attn_with_kvcache(q.expand(2, 3, 4, 16), cache, cache, q[:, :, :2],
                                      q[:, :, :2], cache_seqlens=torch.zeros(2, dtype=torch.int32),
                                      block_table=torch.zeros(2, 1, dtype=torch.int32))
