"""Greedy generation with a small random Llama model whose KV cache is paged and whose decode
attention runs in torch.ops.paged_attn, next to transformers' own generate() on the same weights,
prompts and machine, in the same run. Prints new tokens per second for both.

    .venv/bin/python scripts/examples/example_transformers_decode.py [--dtype bf16] [--batch 8] ...

Nothing is downloaded: the model is built from a config with random weights (seeded).
transformers' generate() decodes the same prompts as one left-padded batch (its usual batched
use); the paged run prefills each prompt alone, then decodes all of them in one batch per step.
Times include prefill; each side runs once untimed first (warm-up), then --repeats times,
alternating, and the fastest run counts (a shared machine makes single runs noisy).
"""

import argparse
import time

import torch
import transformers

import paged_attention_ext
from paged_attention_ext.tools import backends
from paged_attention_ext.integrations import transformers as paged_tf

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=4, help="number of prompts decoded together")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=96)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs of each side, alternating; the fastest is reported")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    return p.parse_args()


def build_model(args, attn_implementation):
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=args.heads * args.head_size, intermediate_size=512,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_size,
        max_position_embeddings=4096, initializer_range=0.08, bos_token_id=None,
        eos_token_id=None, pad_token_id=0)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation)
    return model.eval().to(device=args.device, dtype=DTYPES[args.dtype])


def left_padded(prompts, device):
    """input_ids, attention_mask [batch, longest]: prompts right-aligned, pad id 0 masked out."""
    longest = max(p.numel() for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, longest - p.numel():] = p
        mask[row, longest - p.numel():] = 1
    return ids.to(device), mask.to(device)


def timed(fn):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(args, "sdpa")
    paged_model = build_model(args, paged_tf.ATTN_IMPLEMENTATION)
    paged_model.load_state_dict(model.state_dict())  # the same weights
    gen = torch.Generator().manual_seed(args.seed + 1)
    lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (args.batch,), generator=gen)
    prompts = [torch.randint(1, 1000, (int(n),), generator=gen) for n in lengths]
    ids, mask = left_padded(prompts, args.device)

    def run_paged(new_tokens):
        return paged_tf.generate_greedy(paged_model, prompts, new_tokens,
                                        block_size=args.block_size, seed=args.seed)

    @torch.inference_mode()
    def run_transformers(new_tokens):
        return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                              do_sample=False)

    run_paged(2), run_transformers(2)  # warm-up
    paged_s = reference_s = float("inf")
    for _ in range(args.repeats):
        paged, seconds = timed(lambda: run_paged(args.new_tokens))
        paged_s = min(paged_s, seconds)
        reference, seconds = timed(lambda: run_transformers(args.new_tokens))
        reference_s = min(reference_s, seconds)
    new_total = args.batch * args.new_tokens
    same = (paged.tokens.cpu() == reference[:, ids.shape[1]:].cpu()).sum().item()

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"paged_attention_ext {paged_attention_ext.__version__}")
    print(f"model: Llama, {args.layers} layers, {args.heads} heads / {args.kv_heads} KV heads, "
          f"head size {args.head_size}, {args.dtype} on {args.device}")
    print(f"batch {args.batch}, prompt lengths {lengths.tolist()}, {args.new_tokens} new tokens "
          f"each, block size {args.block_size}")
    print(f"paged_attn backend on {args.device}: {backends.op_backend_name(args.device)}")
    print(f"paged decode (this project):   {new_total / paged_s:8.1f} tokens/s "
          f"({paged_s:.2f} s, fastest of {args.repeats})")
    print(f"transformers generate():       {new_total / reference_s:8.1f} tokens/s "
          f"({reference_s:.2f} s, fastest of {args.repeats})")
    print(f"identical tokens: {same} / {new_total} (generate() runs a padded batch: its "
          f"numerics differ slightly, so near-ties may flip)")
    print("first sequence, paged:", paged.tokens[0, :16].tolist())


if __name__ == "__main__":
    main()
