"""The implementations the benchmark races, each as `prepare(work) -> run() -> out`.

`prepare` allocates outputs and scratch (and, for dense SDPA, the contiguous K/V) outside the
timed region; `run` is one decode step and returns out [batch, heads, head]. v1 / v2 read vLLM's
cache layout; decode reads the NHD-ordered caches ("nhd", and "hnd" as its transposed view); the
oracle and the fallback run whichever op the workload's layout takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from ... import reference
from ...api import num_partitions, use_v1
from . import vllm_cpu
from .workload import Workload, decode


@dataclass(frozen=True)
class Contender:
    name: str
    ours: bool                                   # one of our ops (speedups are relative to it)
    prepare: Callable[[Workload], Callable[[], torch.Tensor]]
    description: str
    devices: tuple = ("cpu", "cuda")
    layouts: tuple = ("vllm", "nhd", "hnd")  # workload kv_layouts it can read
    blocksparse: bool = True                 # computes vLLM's blocksparse attention
    # why it cannot run a workload beyond the above ("" when it can), e.g. a peer not installed
    unavailable: Optional[Callable[[Workload], str]] = None


def _v2_buffers(work: Workload):
    s = work.shape
    parts = num_partitions(work.max_seq_len)
    dev = work.query.device
    out = torch.empty_like(work.query)
    exp_sums = torch.empty(s.batch, s.heads, parts, dtype=torch.float32, device=dev)
    max_logits = torch.empty_like(exp_sums)
    tmp_out = torch.empty(s.batch, s.heads, parts, s.head, dtype=work.query.dtype, device=dev)
    return out, exp_sums, max_logits, tmp_out


def _common(work: Workload) -> tuple:
    s = work.shape
    return (work.query, work.key_cache, work.value_cache, s.kv_heads, work.scale,
            work.block_tables, work.seq_lens, s.block, work.max_seq_len, None,
            work.kv_cache_dtype, work.k_scale, work.v_scale, *work.blocksparse_args())


def _prepare_v1(fn):
    def prepare(work):
        out = torch.empty_like(work.query)
        args = _common(work)
        return lambda: (fn(out, *args), out)[1]
    return prepare


def _prepare_v2(fn):
    def prepare(work):
        bufs = _v2_buffers(work)
        args = _common(work)
        return lambda: (fn(*bufs, *args), bufs[0])[1]
    return prepare


def _prepare_decode(fn):
    def prepare(work):
        out = torch.empty_like(work.query)
        args = (work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens,
                work.scale, None, work.kv_cache_dtype, work.k_scale, work.v_scale)
        return lambda: (fn(out, *args), out)[1]
    return prepare


def _prepare_by_layout(module):
    """v2 of `module` on vLLM's layout, its decode on the others."""
    def prepare(work):
        if work.kv_layout == "vllm":
            return _prepare_v2(module.paged_attention_v2)(work)
        return _prepare_decode(module.decode)(work)
    return prepare


def _prepare_fallback(work):
    from ... import fallback  # the PyTorch implementation devices without a kernel get

    return _prepare_by_layout(fallback)(work)


def _prepare_fallback_v1(work):
    from ... import fallback

    return _prepare_v1(fallback.paged_attention_v1)(work)


def _gather_dense(work: Workload):
    """K, V of every sequence as [batch, kv_heads, ctx, head] (query dtype), through the block
    tables: what a PyTorch user without a paged kernel writes."""
    s = work.shape
    tables = work.block_tables.long()                                  # [B, nb]
    if work.kv_layout != "vllm":                                       # NHD-ordered views
        k, v = (c[tables].permute(0, 3, 1, 2, 4).reshape(s.batch, s.kv_heads, -1, s.head)
                [:, :, :s.ctx] for c in (work.key_cache, work.value_cache))  # [B, kvh, ctx, d]
        return decode(k, work, work.k_scale), decode(v, work, work.v_scale)
    k = work.key_cache[tables]                                         # [B, nb, kvh, d/x, bs, x]
    k = k.permute(0, 2, 1, 4, 3, 5).reshape(s.batch, s.kv_heads, -1, s.head)[:, :, :s.ctx]
    v = work.value_cache[tables]                                       # [B, nb, kvh, d, bs]
    v = v.permute(0, 2, 1, 4, 3).reshape(s.batch, s.kv_heads, -1, s.head)[:, :, :s.ctx]
    return decode(k, work, work.k_scale), decode(v, work, work.v_scale)


def _sdpa(work: Workload, k, v) -> torch.Tensor:
    """Every sequence is ctx long (no mask needed). q [B, H, 1, d] over k, v [B, kvh, L, d]."""
    q = work.query.unsqueeze(2)
    out = F.scaled_dot_product_attention(q, k, v, scale=work.scale, enable_gqa=True)
    return out.squeeze(2)


def _prepare_gather_sdpa(work):
    return lambda: _sdpa(work, *_gather_dense(work))


def _flash_sdpa(work: Workload, k, v):
    """On CUDA, SDPA restricted to the flash backend if it accepts this call (dtype, head size,
    GQA), else None."""
    if work.query.device.type != "cuda":
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return _sdpa(work, k, v)

    try:
        run()
        torch.cuda.synchronize()
    except RuntimeError:  # "No available kernel": flash does not take this call
        return None
    return run


def _prepare_dense_sdpa(work):
    """The yardstick on CUDA: flash SDPA on contiguous K/V when flash takes the call; the
    backend used is named in the row's note (the run's `note` attribute)."""
    k, v = (t.contiguous() for t in _gather_dense(work))  # built once, outside the timing
    flash = _flash_sdpa(work, k, v)
    if flash is not None:
        flash.note = "SDPA backend: flash"
        return flash

    def run():
        return _sdpa(work, k, v)

    run.note = ("SDPA backend: torch's choice (flash refused the call)"
                if work.query.device.type == "cuda" else "SDPA backend: torch's choice")
    return run


def vllm_pick(work: Workload) -> str:
    s = work.shape
    return "v1" if use_v1(work.max_seq_len, s.batch, s.heads) else "v2"


CONTENDERS = {
    "ours-v2": Contender("ours-v2", True, _prepare_v2(torch.ops.paged_attn.v2),
                         "torch.ops.paged_attn.v2", layouts=("vllm",)),
    "ours-v1": Contender("ours-v1", True, _prepare_v1(torch.ops.paged_attn.v1),
                         "torch.ops.paged_attn.v1", layouts=("vllm",)),
    "ours-decode": Contender("ours-decode", True, _prepare_decode(torch.ops.paged_attn.decode),
                             "torch.ops.paged_attn.decode", layouts=("nhd", "hnd")),
    "oracle": Contender("oracle", False, _prepare_by_layout(reference),
                        "paged_attention_ext.reference (pure PyTorch): paged_attention_v2, or "
                        "decode on NHD / HND"),
    "fallback": Contender("fallback", False, _prepare_fallback,
                          "paged_attention_ext.fallback (what torch.ops runs on a device with "
                          "no compiled kernel): paged_attention_v2, or decode on NHD / HND"),
    "fallback-v1": Contender("fallback-v1", False, _prepare_fallback_v1,
                             "paged_attention_ext.fallback.paged_attention_v1 (no partitions)",
                             layouts=("vllm",)),
    "gather-sdpa": Contender("gather-sdpa", False, _prepare_gather_sdpa,
                             "gather K/V through block tables + F.scaled_dot_product_attention",
                             blocksparse=False),
    "sdpa-dense": Contender("sdpa-dense", False, _prepare_dense_sdpa,
                            "F.scaled_dot_product_attention on contiguous K/V (no paging; "
                            "a lower bound for dense attention; on CUDA the flash backend "
                            "when it takes the call)", blocksparse=False),
    "vllm-cpu": Contender("vllm-cpu", False, vllm_cpu.prepare,
                          "vLLM's CPU kernel (torch.ops._C.cpu_attention_with_kv_cache, from a "
                          "vllm-cpu install; its library, ISA and cache layout, the same K/V)",
                          devices=("cpu",), blocksparse=False, unavailable=vllm_cpu.unavailable),
}
DEFAULT_CPU = ("ours-v2", "ours-v1", "ours-decode", "fallback", "oracle", "gather-sdpa")
DEFAULT_CUDA = DEFAULT_CPU + ("sdpa-dense",)


def applicable(contender: Contender, kv_layout: str, blocksparse: bool) -> str:
    """Why `contender` cannot run this workload ("" when it can)."""
    if kv_layout not in contender.layouts:
        return f"does not read the {kv_layout} layout"
    if blocksparse and not contender.blocksparse:
        return "does not compute blocksparse attention"
    return ""


def default_contenders(device: str, kv_layout: str = "vllm", blocksparse: bool = False) -> tuple:
    """The defaults that apply; on CPU vLLM's kernel too when a vllm-cpu install loads here."""
    names = DEFAULT_CUDA if device == "cuda" else DEFAULT_CPU
    if device == "cpu" and not vllm_cpu.load():
        names += ("vllm-cpu",)
    return tuple(n for n in names if not applicable(CONTENDERS[n], kv_layout, blocksparse))
