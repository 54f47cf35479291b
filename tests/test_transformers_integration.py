"""A real client: greedy decoding of a transformers Llama model with its KV cache paged and every
decode step's attention in torch.ops.paged_attn (paged_attention_ext.integrations.transformers),
against transformers' own generate() on the same weights.

Models are small and randomly initialised from a config (no download), seeded. Their weights use
initializer_range 0.08 so that q.k / sqrt(d) has a spread of a few units: attention is sharp (a
wrong token order or block lookup changes the output), unlike the near-uniform attention of the
default 0.02 init.

What is asserted, per sequence (4 prompts of different lengths, decoded together):
- tokens: fp32 exactly equal to generate()'s for all steps. bf16 equal up to the first step where
  they differ, and that step must be a near-tie of generate()'s own logits (its pick beats ours
  by <= 4 bf16 ulps of the largest logit). bf16 logits lie on a grid with ~0.03 spacing, so exact
  ties between two of 1000 logits are common, and any rounding difference flips them; after a
  flip the two runs decode different text, so the later steps are not comparable.
- logits, at every compared step: error against a float64 run of the same model (teacher-forced
  on the same tokens) at most twice transformers' own error in the same dtype, plus eps * max
  |logit| (FlashAttention's rule: as accurate as the framework's own attention).
The ops run on whichever backend is active for CPU (compiled kernel, else the PyTorch one).
"""

import copy

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (optional: pip install "
    "'paged_attention_ext[transformers]')")

try:  # ImportError also when transformers is older than the integration needs
    from paged_attention_ext.integrations import transformers as paged_tf
except ImportError as error:
    pytest.skip(f"transformers integration unavailable: {error}", allow_module_level=True)
from paged_attention_ext.integrations.paged_kv_cache import PagedKVCache  # noqa: E402

NEW_TOKENS = 32
PROMPT_LENS = (5, 17, 33, 60)  # block_size 16: 1..4 blocks, crossing block boundaries in decode
GEOMETRIES = {  # name: (num_heads, num_kv_heads, head_size)
    "llama-gqa4": (8, 2, 32),  # hidden 256
    "llama-gqa6": (12, 2, 32),  # hidden 384
}
_MODELS = {}


def _base_model(name):
    """fp32 LlamaForCausalLM with sdpa attention, random weights seeded by the geometry."""
    if name not in _MODELS:
        num_heads, num_kv_heads, head_size = GEOMETRIES[name]
        config = transformers.LlamaConfig(
            vocab_size=1000, hidden_size=num_heads * head_size, intermediate_size=512,
            num_hidden_layers=2, num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads, head_dim=head_size, max_position_embeddings=2048,
            initializer_range=0.08, bos_token_id=None, eos_token_id=None, pad_token_id=None)
        torch.manual_seed(1234 + num_heads)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
        _MODELS[name] = model.eval()
    return _MODELS[name]


def _prompts(lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 1000, (n,), generator=gen) for n in lengths]


@torch.inference_mode()
def _transformers_generate(model, prompts, max_new_tokens):
    """transformers' own greedy generate() (DynamicCache, sdpa), one prompt at a time (no padding).
    Returns tokens int64 [num_seqs, n] and logits float32 [n, num_seqs, vocab]."""
    tokens, logits = [], []
    for prompt in prompts:
        out = model.generate(prompt[None], max_new_tokens=max_new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
        tokens.append(out.sequences[0, prompt.numel():])
        logits.append(torch.stack([step[0] for step in out.logits]).float())
    return torch.stack(tokens), torch.stack(logits, dim=1)


@torch.inference_mode()
def _float64_logits(model64, prompt, tokens):
    """float32 [n, vocab]: the float64 model's logits for each step, teacher-forced on `tokens`."""
    ids = torch.cat([prompt, tokens[:-1]])[None]
    return model64(ids).logits[0, prompt.numel() - 1:].float()


def _check_against_transformers(model, prompts, ours, ref_tokens, ref_logits, dtype):
    """The assertions of the module docstring; returns the number of steps compared."""
    model64 = copy.deepcopy(model).double()
    eps = torch.finfo(dtype).eps
    compared = 0
    for s, prompt in enumerate(prompts):
        differs = (ours.tokens[s] != ref_tokens[s]).nonzero().flatten().tolist()
        k = differs[0] if differs else ref_tokens.shape[1]  # first differing step
        if differs:
            assert dtype != torch.float32, f"seq {s}: fp32 tokens differ from step {k}"
            ref_step = ref_logits[k, s]
            margin = (ref_step[ref_tokens[s, k]] - ref_step[ours.tokens[s, k]]).item()
            tie = 4 * eps * ref_step.abs().max().item()
            assert margin <= tie, (f"seq {s} step {k}: token {ours.tokens[s, k]} instead of "
                                   f"{ref_tokens[s, k]}, margin {margin} > near-tie {tie}")
        steps = slice(0, k + 1)  # both runs consumed the same tokens up to step k
        truth = _float64_logits(model64, prompt, ref_tokens[s])[steps]
        err_ours = (ours.logits[steps, s] - truth).abs().max().item()
        err_ref = (ref_logits[steps, s] - truth).abs().max().item()
        bound = 2 * err_ref + eps * truth.abs().max().item()
        assert err_ours <= bound, (f"seq {s}: logit error {err_ours} vs float64 exceeds twice "
                                   f"transformers' own ({err_ref}) + eps * max: {bound}")
        compared += min(k + 1, ref_tokens.shape[1])
    return compared


def _paged_model(model):
    """The same weights loaded as users load a model: attn_implementation="paged_attn"."""
    paged = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(model.config), attn_implementation=paged_tf.ATTN_IMPLEMENTATION)
    paged.load_state_dict(model.state_dict())
    assert paged.config._attn_implementation == paged_tf.ATTN_IMPLEMENTATION
    return paged.to(model.dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", list(GEOMETRIES))
def test_greedy_decode_matches_transformers_generate(paged_ops, name, dtype):
    model = copy.deepcopy(_base_model(name)).to(dtype)
    prompts = _prompts(PROMPT_LENS, seed=7)
    ref_tokens, ref_logits = _transformers_generate(model, prompts, NEW_TOKENS)
    ours = paged_tf.generate_greedy(_paged_model(model), prompts, NEW_TOKENS, seed=3, poison=True)
    assert ours.tokens.shape == (len(prompts), NEW_TOKENS)
    compared = _check_against_transformers(model, prompts, ours, ref_tokens, ref_logits, dtype)
    assert compared >= len(prompts)  # at least the prefill step of every sequence


@pytest.mark.parametrize("version,prompt_lens,new_tokens", [
    ("v2", PROMPT_LENS, 12),  # v2 forced with a single partition
    ("auto", (520, 9), 6),  # 2 partitions: vLLM's rule picks v2
])
def test_v2_decode_matches_transformers_generate(paged_ops, version, prompt_lens, new_tokens,
                                                 monkeypatch):
    calls = {"v1": 0, "v2": 0}
    decode = paged_tf._decode

    def counting_decode(query, key_cache, value_cache, num_kv_heads, scale, step):
        chosen = step.version
        if chosen == "auto":
            chosen = paged_tf.choose_version(query.device, step.max_seq_len, query.shape[0],
                                             query.shape[1],
                                             step.block_tables.size(1) * key_cache.size(3))
        calls[chosen] += 1
        return decode(query, key_cache, value_cache, num_kv_heads, scale, step)

    monkeypatch.setattr(paged_tf, "_decode", counting_decode)
    model = _base_model("llama-gqa4")
    prompts = _prompts(prompt_lens, seed=8)
    ref_tokens, ref_logits = _transformers_generate(model, prompts, new_tokens)
    ours = paged_tf.generate_greedy(_paged_model(model), prompts, new_tokens, version=version,
                                    seed=4, poison=True)
    _check_against_transformers(model, prompts, ours, ref_tokens, ref_logits, torch.float32)
    assert calls == {"v1": 0, "v2": (new_tokens - 1) * 2}  # every decode step, both layers


def test_a_wrong_block_lookup_is_caught(paged_ops, monkeypatch):
    """Negative control: decode reading each sequence's first two blocks swapped must fail the
    comparison (the harness can see an attention error)."""
    prepare = PagedKVCache.prepare_step

    def swapped_tables(self, seq_ids, num_new_tokens, **kwargs):
        step = prepare(self, seq_ids, num_new_tokens, **kwargs)
        if all(n == 1 for n in num_new_tokens):  # decode: reads go through the tables
            for row, seq_len in enumerate(step.seq_lens.tolist()):
                if seq_len > self.block_size:
                    step.block_tables[row, :2] = step.block_tables[row, :2].flip(0).clone()
        return step

    model = _base_model("llama-gqa4")
    prompts = _prompts((17, 33, 60), seed=9)
    ref_tokens, ref_logits = _transformers_generate(model, prompts, 4)
    monkeypatch.setattr(PagedKVCache, "prepare_step", swapped_tables)
    ours = paged_tf.generate_greedy(_paged_model(model), prompts, 4, seed=5)
    with pytest.raises(AssertionError):
        _check_against_transformers(model, prompts, ours, ref_tokens, ref_logits, torch.float32)


def test_the_driver_and_the_attention_function_refuse_misuse(paged_ops):
    model = _base_model("llama-gqa4")
    with pytest.raises(ValueError, match="attn_implementation"):
        paged_tf.generate_greedy(model, _prompts((4,), seed=1), 2)  # still sdpa
    paged = _paged_model(model)
    with pytest.raises(ValueError, match="paged_step"):
        paged(torch.tensor([[1, 2, 3]]), use_cache=False)

    # Attention variants the ops do not compute are refused, not silently ignored.
    cache = PagedKVCache(1, 2, 32, num_blocks=4, block_size=8, dtype=torch.float32)
    layer, seq = _Layer(8, 2), cache.add_sequence()
    q, kv = torch.randn(1, 8, 10, 32), torch.randn(1, 2, 10, 32)
    step = cache.prepare_step([seq], [10])
    for kwargs, message in [({"sliding_window": 4}, "sliding window"), ({"softcap": 30.0}, "soft"),
                            ({"s_aux": torch.zeros(8)}, "sinks"), ({"dropout": 0.1}, "dropout")]:
        with pytest.raises(ValueError, match=message):
            paged_tf.paged_attention_forward(layer, q, kv, kv, None, paged_step=step, **kwargs)
    # A window no sequence has reached yet changes nothing: allowed.
    out, _ = paged_tf.paged_attention_forward(layer, q, kv, kv, None, paged_step=step,
                                              sliding_window=10)
    assert out.shape == (1, 10, 8, 32) and out.isfinite().all()


# ---- ALiBi ----
# No ALiBi model of transformers (Bloom, MPT, Falcon) computes attention through the
# AttentionInterface, so ALiBi cannot be tested inside a transformers model. Instead the attention
# function itself runs a whole batched decode (prefill, then steps; cache writes, shuffled blocks,
# sequences of different lengths) with ALiBi slopes, against a float64 dense causal attention
# with the bias slope[h] * (j - i) over every token so far.

def _alibi_slopes(num_heads):
    """The ALiBi paper's slopes 2^(-8 (h+1) / num_heads) (num_heads a power of two)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)])


def _dense_alibi(query, keys, values, slopes, scale, first_position):
    """float64 causal attention. query [H, q, d] at positions first_position ..; keys, values
    [KVH, n, d] for positions 0 .. n-1. Returns [q, H, d]."""
    num_heads, q_len, _ = query.shape
    group = num_heads // keys.shape[0]
    k = keys.double().repeat_interleave(group, 0)
    v = values.double().repeat_interleave(group, 0)
    logits = scale * query.double() @ k.transpose(1, 2)  # [H, q, n]
    i = torch.arange(first_position, first_position + q_len)[:, None]
    j = torch.arange(keys.shape[1])[None, :]
    logits = logits + slopes.double()[:, None, None] * (j - i)
    logits = logits.masked_fill(j > i, float("-inf"))
    return (logits.softmax(-1) @ v).transpose(0, 1)


class _Layer(torch.nn.Module):
    """What the attention function reads from a transformers attention module."""

    def __init__(self, num_heads, num_kv_heads):
        super().__init__()
        self.layer_idx, self.is_causal = 0, True
        self.num_key_value_groups = num_heads // num_kv_heads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_alibi_batched_decode_through_the_attention_function(paged_ops, dtype):
    from paged_attention_ext.tools import testing

    num_heads, num_kv_heads, head_size, prompt_lens, steps = 8, 2, 32, (3, 18, 40), 20
    scale = head_size ** -0.5
    slopes = _alibi_slopes(num_heads)
    gen = torch.Generator().manual_seed(21)
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    cache = PagedKVCache(1, num_kv_heads, head_size, num_blocks=24, block_size=8, dtype=dtype,
                         seed=6, poison=True)
    layer = _Layer(num_heads, num_kv_heads)
    seq_ids = [cache.add_sequence() for _ in prompt_lens]
    history = []  # per sequence: (keys, values) [KVH, n, d]
    atol, rtol = testing.tolerances(dtype)

    for seq_id, n in zip(seq_ids, prompt_lens):  # prefill
        q, k, v = randn(1, num_heads, n, head_size), randn(1, num_kv_heads, n, head_size), \
            randn(1, num_kv_heads, n, head_size)
        step = cache.prepare_step([seq_id], [n], alibi_slopes=slopes)
        out, _ = paged_tf.paged_attention_forward(layer, q, k, v, None, scaling=scale,
                                                  paged_step=step)
        expected = _dense_alibi(q[0], k[0], v[0], slopes, scale, 0)
        # The prefill runs in the model dtype (probabilities rounded): 2x the op tolerance.
        torch.testing.assert_close(out[0].double(), expected, atol=2 * atol, rtol=2 * rtol)
        history.append((k[0], v[0]))

    for _ in range(steps):  # batched decode: one new token per sequence
        q = randn(len(seq_ids), num_heads, 1, head_size)
        k, v = randn(len(seq_ids), num_kv_heads, 1, head_size), \
            randn(len(seq_ids), num_kv_heads, 1, head_size)
        step = cache.prepare_step(seq_ids, [1] * len(seq_ids), alibi_slopes=slopes)
        out, _ = paged_tf.paged_attention_forward(layer, q, k, v, None, scaling=scale,
                                                  paged_step=step)
        for s in range(len(seq_ids)):
            keys = torch.cat([history[s][0], k[s]], dim=1)
            values = torch.cat([history[s][1], v[s]], dim=1)
            history[s] = (keys, values)
            expected = _dense_alibi(q[s], keys, values, slopes, scale, keys.shape[1] - 1)
            torch.testing.assert_close(out[s].double(), expected, atol=atol, rtol=rtol)
    assert [cache.seq_len(s) for s in seq_ids] == [n + steps for n in prompt_lens]
    blocks = [b for s in seq_ids for b in cache.block_table(s)]
    assert len(set(blocks)) == len(blocks)  # no block shared between sequences
    assert blocks != sorted(blocks)  # shuffled, non-contiguous
