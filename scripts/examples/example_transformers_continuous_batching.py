"""transformers' continuous batching (model.generate_batch) with the paged ops, next to the same
call with transformers' sdpa, on a small random Llama model: same prompts, same run. Prints
whether the greedy tokens agree, how many decode calls reached torch.ops.paged_attn.decode, and
new tokens per second for both.

    .venv/bin/python scripts/examples/example_transformers_continuous_batching.py [--dtype bf16] ...

The user code is the two lines marked below; nothing is downloaded (random weights, seeded).
Times include prefill; each side runs once untimed first, then --repeats times, alternating, and
the fastest run counts.
"""

import argparse
import copy
import time

import torch
import transformers

from paged_attention_ext.tools import backends
from paged_attention_ext.integrations.transformers import CONTINUOUS_BATCHING

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=8, help="number of prompts")
    p.add_argument("--min-prompt", type=int, default=16)
    p.add_argument("--max-prompt", type=int, default=600)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-size", type=int, default=32)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def build_model(args):
    config = transformers.LlamaConfig(
        vocab_size=1000, hidden_size=args.heads * args.head_size, intermediate_size=512,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_size,
        max_position_embeddings=4096, initializer_range=0.08, bos_token_id=None,
        eos_token_id=None, pad_token_id=None)
    torch.manual_seed(args.seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(device=args.device, dtype=DTYPES[args.dtype]).eval()


def generate_batch(model, prompts, args):
    """(tokens per prompt in prompt order, seconds)."""
    generation_config = transformers.GenerationConfig(
        max_new_tokens=args.new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    # A cache sized for these prompts (transformers would otherwise take most of free memory).
    num_blocks = sum(-(-(len(p) + args.new_tokens) // args.page_size) + 1 for p in prompts)
    cb_config = transformers.ContinuousBatchingConfig(page_size=args.page_size,
                                                      num_blocks=num_blocks)
    start = time.perf_counter()
    results = model.generate_batch(prompts, generation_config=generation_config,
                                   continuous_batching_config=cb_config)
    seconds = time.perf_counter() - start
    order = sorted(results, key=lambda request_id: int(request_id.rsplit("_", 1)[1]))
    return [list(results[r].generated_tokens) for r in order], seconds


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sdpa_model = build_model(args)
    paged_model = copy.deepcopy(sdpa_model)
    paged_model.set_attn_implementation(CONTINUOUS_BATCHING)  # the user code: this line ...

    gen = torch.Generator().manual_seed(args.seed + 1)
    lengths = torch.randint(args.min_prompt, args.max_prompt + 1, (args.batch,), generator=gen)
    prompts = [torch.randint(1, 1000, (int(n),), generator=gen).tolist() for n in lengths]

    decode_calls = [0]
    decode = torch.ops.paged_attn.decode

    def counted_decode(*a, **k):
        decode_calls[0] += 1
        return decode(*a, **k)

    torch.ops.paged_attn.decode = counted_decode
    best = {"paged": float("inf"), "sdpa": float("inf")}
    tokens = {}
    for run in range(args.repeats + 1):  # run 0: warm-up
        for name, model in (("paged", paged_model), ("sdpa", sdpa_model)):
            tokens[name], seconds = generate_batch(model, prompts, args)  # ... and this one
            if run:
                best[name] = min(best[name], seconds)
    torch.ops.paged_attn.decode = decode

    new_tokens = args.batch * args.new_tokens
    same = sum(a == b for a, b in zip(tokens["paged"], tokens["sdpa"]))
    key = "CUDA" if args.device.startswith("cuda") else "CPU"
    kernel = "C++ kernel" if backends.compiled_kernel("decode", key) else "PyTorch implementation"
    print(f"paged_attn.decode on {args.device}: {kernel}")
    print(f"{args.batch} prompts of {min(lengths.tolist())}..{max(lengths.tolist())} tokens, "
          f"{args.new_tokens} new each, {args.dtype}, page size {args.page_size}")
    print(f"greedy tokens equal for {same}/{args.batch} prompts; "
          f"paged_attn.decode calls: {decode_calls[0]} over {args.repeats + 1} runs")
    for name in ("paged", "sdpa"):
        print(f"{name:>5}: {new_tokens / best[name]:8.1f} new tok/s")


if __name__ == "__main__":
    main()
