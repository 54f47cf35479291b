"""Python-side registration of the paged_attn ops.

- When the compiled extension `_C` is missing, define the schemas here (paged_attention_ext/
  schemas.py, the list csrc/ops.cpp is built from), so user code never changes.
- Always register:
  * fake (meta) kernels for torch.compile / opcheck: shape checks only, no data reads;
  * the pure-PyTorch implementation for CompositeExplicitAutograd, so any device with no compiled
    kernel (a CPU-only build used on CUDA, an exotic accelerator) still runs. Compiled CPU / CUDA
    kernels take precedence over it for their own devices.
"""

import torch

from . import schemas, validation

_LIBS = []  # keep torch.library.Library objects alive: dropping them unregisters the ops


def _define_schemas():
    lib = torch.library.Library(schemas.LIBRARY, "DEF")
    for schema in schemas.full_schemas():
        lib.define(schema)
    _LIBS.append(lib)


def _fake_v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
             block_size, max_seq_len, alibi_slopes, kv_cache_dtype="auto", k_scale=1.0,
             v_scale=1.0, tp_rank=0, blocksparse_local_blocks=0, blocksparse_vert_stride=0,
             blocksparse_block_size=64, blocksparse_head_sliding_step=0):
    validation.check_attention_args(
        "v1", out, None, None, None, query, key_cache, value_cache, num_kv_heads, scale,
        block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
        v_scale, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
        blocksparse_block_size, blocksparse_head_sliding_step)


def _fake_v2(out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
             scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
             kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, tp_rank=0,
             blocksparse_local_blocks=0, blocksparse_vert_stride=0, blocksparse_block_size=64,
             blocksparse_head_sliding_step=0):
    validation.check_attention_args(
        "v2", out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
        scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
        k_scale, v_scale, tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
        blocksparse_block_size, blocksparse_head_sliding_step)


def _fake_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                            kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0):
    validation.check_cache_args("reshape_and_cache", key, value, key_cache, value_cache,
                                slot_mapping, kv_cache_dtype, k_scale, v_scale)


def _fake_decode(out, query, key_cache, value_cache, block_tables, seq_lens, scale,
                 alibi_slopes, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0):
    validation.check_decode_args("decode", out, query, key_cache, value_cache, block_tables,
                                 seq_lens, scale, alibi_slopes, kv_cache_dtype, k_scale, v_scale)


def _fake_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                  kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0):
    validation.check_flash_cache_args("reshape_and_cache_flash", key, value, key_cache,
                                      value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def _register_impls(implementation):
    """`implementation`: a module with paged_attention_v1 / paged_attention_v2 /
    reshape_and_cache / decode / reshape_and_cache_flash taking the ops' arguments in order."""
    lib = torch.library.Library(schemas.LIBRARY, "IMPL")
    fakes = {"v1": _fake_v1, "v2": _fake_v2, "reshape_and_cache": _fake_reshape_and_cache,
             "decode": _fake_decode, "reshape_and_cache_flash": _fake_reshape_and_cache_flash}
    impls = {"v1": implementation.paged_attention_v1, "v2": implementation.paged_attention_v2,
             "reshape_and_cache": implementation.reshape_and_cache,
             "decode": implementation.decode,
             "reshape_and_cache_flash": implementation.reshape_and_cache_flash}
    for name, _ in schemas.SCHEMAS:
        op = name.split(".")[0]
        lib.impl(name, impls[op], "CompositeExplicitAutograd")
        torch.library.register_fake(f"{schemas.LIBRARY}::{name}", fakes[op], lib=lib)
    _LIBS.append(lib)


def register(extension_loaded: bool, implementation) -> None:
    if not extension_loaded:
        _define_schemas()
    _register_impls(implementation)
