"""Benchmark shapes: named decode presets and `--shape key=value,...` parsing.

A shape is one decode step: `batch` sequences, each `ctx` tokens long, one query token each.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Shape:
    family: str        # preset family, groups shapes in the plot (same family, varying ctx)
    batch: int         # num_seqs
    heads: int         # query heads
    kv_heads: int      # KV heads (GQA when < heads)
    head: int          # head_size
    ctx: int           # tokens per sequence
    block: int = 16    # block_size (tokens per KV block)

    @property
    def label(self) -> str:
        return (f"{self.family} b{self.batch} {self.heads}/{self.kv_heads}h d{self.head} "
                f"ctx{_short(self.ctx)}")

    def as_dict(self) -> dict:
        return asdict(self)


def _short(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 and n % 1000 == 0 else (
        f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n))


def _llama(batch, ctx, family="llama3-8b"):
    return Shape(family, batch, 32, 8, 128, ctx)


# family -> (quick shapes, full shapes). Quick: fits about a minute on 2 CPU cores.
_PRESETS = {
    "llama3-8b": ([_llama(8, 1024), _llama(8, 4096)],
                  [_llama(8, 1024), _llama(8, 4096), _llama(8, 16384)]),
    "mha": ([Shape("mha", 4, 32, 32, 128, 2048)], [Shape("mha", 4, 32, 32, 128, 4096)]),
    "qwen": ([Shape("qwen", 1, 24, 4, 256, 16384)], [Shape("qwen", 1, 24, 4, 256, 100_000)]),
    "many-short": ([_llama(64, 256, "many-short")], [_llama(64, 256, "many-short")]),
    # The CUDA regimes (docs/CUDA.md, "Performance model"): one shape each, the same in quick
    # and full. With --kv-cache-dtype fp8 they give the fp8-cache regime.
    "big-batch": ([_llama(64, 4096, "big-batch")], [_llama(64, 4096, "big-batch")]),
    "small-batch": ([_llama(8, 1024, "small-batch")], [_llama(8, 1024, "small-batch")]),
    # GQA 8: a 70B-class model on one device (64 query heads over 8 KV heads).
    "gqa8": ([Shape("gqa8", 32, 64, 8, 128, 4096)], [Shape("gqa8", 32, 64, 8, 128, 4096)]),
    # A 70B-class model split 8 ways by tensor parallelism: 8 query heads, 1 KV head per device.
    "tp8-kv1": ([Shape("tp8-kv1", 128, 8, 1, 128, 4096)],
                [Shape("tp8-kv1", 128, 8, 1, 128, 4096)]),
    "long": ([_llama(1, 100_000, "long")], [_llama(1, 100_000, "long")]),
    # For tests and smoke runs: seconds on any machine.
    "tiny": ([Shape("tiny", 3, 4, 2, 64, 100), Shape("tiny", 3, 4, 2, 64, 700)],
             [Shape("tiny", 3, 4, 2, 64, 100), Shape("tiny", 3, 4, 2, 64, 700)]),
}
# Too slow for the CPU contenders (the oracle alone takes minutes): refused with --device cpu.
CUDA_ONLY = ("big-batch", "gqa8", "tp8-kv1", "long")
# One shape per regime of the CUDA performance model, in its order.
CUDA_REGIMES = ("big-batch", "small-batch", "gqa8", "tp8-kv1", "long")
CPU_DEFAULT = ("llama3-8b", "mha", "qwen", "many-short")
CUDA_DEFAULT = CPU_DEFAULT + ("big-batch", "long")
PRESET_NAMES = tuple(_PRESETS)


def preset_shapes(names, full: bool, device: str) -> list:
    shapes = []
    for name in names:
        if name not in _PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose from {', '.join(PRESET_NAMES)}")
        if name in CUDA_ONLY and device != "cuda":
            raise ValueError(f"preset {name!r} is for --device cuda only (too slow on {device}); "
                             f"CUDA-only presets: {', '.join(CUDA_ONLY)}")
        shapes.extend(_PRESETS[name][1 if full else 0])
    return shapes


def default_presets(device: str) -> tuple:
    return CUDA_DEFAULT if device == "cuda" else CPU_DEFAULT


_KEYS = {"batch": "batch", "heads": "heads", "kv_heads": "kv_heads", "head": "head",
         "ctx": "ctx", "block": "block"}


def _parse_int(text: str) -> int:
    """'4096', '4k' (4096), '100k' (100000: a 'k' multiple of 1000 unless it is a power of 2)."""
    text = text.strip().lower()
    try:
        if text.endswith("k"):
            n = int(text[:-1])
            return n * 1024 if n & (n - 1) == 0 else n * 1000
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number (or one with a k suffix)") from None


def parse_shape(spec: str) -> list:
    """'batch=8,heads=32,kv_heads=8,head=128,ctx=4096,block=16' -> [Shape]. `ctx` may list
    several lengths separated by '/' (ctx=1k/4k/16k) to give a curve. Missing keys take the
    Llama-3-8B values (batch 8, 32/8 heads, head 128, ctx 4096, block 16)."""
    values = {"batch": 8, "heads": 32, "kv_heads": 8, "head": 128, "block": 16}
    ctxs = [4096]
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise ValueError(f"bad --shape item {item!r}: expected key=value with key in "
                             f"{', '.join(_KEYS)}")
        try:
            if key == "ctx":
                ctxs = [_parse_int(v) for v in value.split("/")]
            else:
                values[key] = _parse_int(value)
        except ValueError as error:
            raise ValueError(f"--shape {key}: {error}") from None
    if values["heads"] % values["kv_heads"]:
        raise ValueError(f"--shape: heads ({values['heads']}) must be divisible by kv_heads "
                         f"({values['kv_heads']})")
    if min([*values.values(), *ctxs]) <= 0:
        raise ValueError(f"--shape: every size must be positive in {spec!r}")
    base = Shape("custom", values["batch"], values["heads"], values["kv_heads"], values["head"],
                 ctxs[0], values["block"])
    return [replace(base, ctx=c) for c in ctxs]
