"""The case files the torch-free drivers read: tests/cross/driver.cpp (the CPU kernel variants,
scripts/ci/cross_test.sh, tests/test_cpu_kernel_cross.py) and the CUDA host simulation
(tests/test_cuda_host_sim.py).

Cases come from paged_attention_ext.tools.testing (shuffled block tables with garbage past each row,
NaN in every cache slot no sequence uses, fp8 k/v scales != 1); the expected `out` from the oracle
reference.paged_attention_v2 (vLLM's cache layout) or reference.decode (token-major caches:
testing.DECODE_LAYOUTS), with testing.tolerances; a blocksparse case (vLLM's layout) has NaN in
every (cache block, KV head) no query head attends; an every-byte case
(testing.every_fp8_byte_inputs) puts all 256 bytes of an fp8 format through K or V. One
little-endian file per case:
  "PACASE3\\0", int64[26] (see HEADER_INTS; bs_vert_stride 0: dense),
  float32[5] (scale k_scale v_scale atol rtol), name,
  query fp32 [S,H,D] | K cache raw bytes | V cache raw bytes | block_tables int32 [S,M] |
  seq_lens int32 [S] | alibi fp32 [H] (if has_alibi) | expected out fp32 [S,H,D]
The cache bytes run from the cache's first element to the end of its storage (a strided view
keeps its strides: kv_form (core/kv_layout.h KvForm) and each cache's block / head / token
strides in the header).

Also a script: `python tests/support/cross_cases.py DIR` writes the cases to DIR.
"""

import os
import struct
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # run as a script from anywhere
from paged_attention_ext import reference  # noqa: E402
from paged_attention_ext.core import key_chunk_elements  # noqa: E402
from paged_attention_ext.tools import testing  # noqa: E402
from paged_attention_ext.validation import Blocksparse, parse_kv_cache_dtype  # noqa: E402
from support.blocksparse import mask as blocksparse_mask  # noqa: E402
from support.blocksparse import poison_skipped  # noqa: E402


MAGIC = b"PACASE3\0"
HEADER_INTS = ("scalar_kind", "cache_kind", "num_seqs", "num_heads", "num_kv_heads", "head_size",
               "block_size", "x", "max_blocks_per_seq", "num_blocks", "has_alibi", "kv_form",
               "k_block_stride", "k_head_stride", "k_token_stride", "v_block_stride",
               "v_head_stride", "v_token_stride", "k_bytes", "v_bytes", "name_len",
               "bs_tp_rank", "bs_local_blocks", "bs_vert_stride", "bs_block_size",
               "bs_head_sliding_step")
SCALAR_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}  # params.h ScalarKind
CACHE_KIND = {"auto": 0, "fp8_e4m3": 1, "fp8_e5m2": 2}  # params.h CacheKind

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# (dtype, kv_cache_dtype, num_heads, num_kv_heads, head_size, block_size, seq_lens, alibi, layout
#  [, blocksparse: validation.Blocksparse, vLLM's layout only])
CASES = [
    (F32, "auto", 8, 2, 128, 16, [1, 511, 512, 513, 0, 1537], False, None),  # GQA 4
    (BF16, "auto", 12, 2, 256, 16, [700, 33], True, None),  # GQA 6, ALiBi
    (F16, "auto", 8, 8, 80, 5, [511, 1030], False, None),  # GQA 1, odd block size
    (F32, "auto", 8, 1, 64, 8, [300, 1025], True, None),  # GQA 8
    (F32, "auto", 6, 2, 20, 32, [77, 600], False, None),  # head 20 = 5 x (x = 4), GQA 3
    (BF16, "auto", 4, 1, 40, 16, [513, 5, 0], False, None),  # head 40 = 5 x (x = 8)
    (F16, "auto", 16, 2, 128, 16, [2049, 1], True, None),  # GQA 8, 5 partitions
    (F32, "fp8", 8, 2, 64, 16, [300, 1025], True, None),  # e4m3, x = 16
    (BF16, "fp8_e4m3", 6, 1, 128, 8, [1, 600, 0], False, None),  # GQA 6
    (F16, "fp8_e4m3", 4, 4, 80, 1, [0, 513, 3], False, None),  # head 80 = 5 x (x = 16), bs 1
    (F16, "fp8_e5m2", 4, 2, 48, 32, [77, 513], False, None),  # head 48 = 3 x
    (BF16, "fp8_e5m2", 8, 1, 256, 5, [512, 1100], True, None),  # GQA 8, head 256
    (F32, "auto", 4, 2, 32, 1, [5, 513], False, None),  # block size 1
    (F32, "auto", 8, 2, 64, 16, [1, 600, 1025], False, "head_padding"),  # outer strides
    (BF16, "fp8_e4m3", 8, 2, 64, 16, [1, 600, 1025], False, "blocks_interleaved"),
    (F32, "auto", 4, 2, 32, 16, [0, 0], False, None),  # every row empty: zeros
    # items of 1-5 tokens (the kernel's short path up to 4), crossing blocks of 3 / 1
    (BF16, "auto", 12, 2, 80, 3, [1, 2, 3, 4, 5, 514], True, None),
    (F32, "fp8_e5m2", 4, 2, 48, 1, [2, 4, 516], False, "nhd"),
    # token-major caches (decode): the kernel's second form
    (F32, "auto", 8, 2, 128, 16, [1, 511, 0, 1537], False, "nhd"),  # GQA 4
    (BF16, "auto", 12, 2, 256, 16, [700, 33], True, "hnd"),  # GQA 6, ALiBi
    (F16, "auto", 8, 8, 80, 5, [511, 1030], False, "combined"),  # MHA, odd block size
    (F32, "auto", 6, 2, 20, 32, [77, 600], False, "mixed"),  # head 20: 4-dim tail, K != V strides
    (BF16, "auto", 4, 1, 40, 7, [513, 5], False, "combined_hnd"),  # head 40: 8-dim tail
    (F32, "fp8", 8, 2, 64, 1, [300, 77], True, "padded"),  # e4m3, block size 1
    (BF16, "fp8_e5m2", 8, 1, 112, 16, [1100, 2], False, "hnd"),
    # bf16 shapes of amx's tiles: GQA 4 with blocks of 32 / 64, a 16-dim tail, NHD
    (BF16, "auto", 32, 8, 128, 64, [77, 1100], False, None),
    (BF16, "auto", 12, 4, 80, 32, [600, 9], True, "nhd"),
    # blocksparse (phi-3-small's pattern; head sliding per KV head, a sparse block that is not a
    # multiple of the cache block)
    (F32, "auto", 8, 2, 64, 16, [1100, 300], True, None, Blocksparse(1, 3, 8, 64, 2)),
    (BF16, "fp8_e5m2", 4, 2, 32, 8, [700, 77], False, None, Blocksparse(1, 1, 3, 12, -1)),
]


def every_byte_case(kv, side, layout=None):
    """A CASES entry for testing.every_fp8_byte_inputs(kv, side, layout or "vllm"): its shape
    (GQA 16, head 64, fp32 query, blocks of 16), then the side where a blocksparse entry goes."""
    return (F32, kv, 64, 4, 64, 16, [16] * (2 if side == "value" else 4), False, layout, side)


# every fp8 byte through V and K, each decode path: vLLM's K and V, token-major K's token pairs
CASES += [every_byte_case(kv, side, layout) for kv in ("fp8_e4m3", "fp8_e5m2")
          for side, layout in (("value", None), ("key", None), ("key", "nhd"), ("value", "hnd"))]
KV_FORM = {"vllm": 0, "token_major": 1}  # core/kv_layout.h KvForm


def case_name(i, c):
    dtype, kv, nh, nkv, d, bs, lens, alibi, layout = c[:9]
    return (f"{i:02d}-{str(dtype)[6:]}-{kv}-h{nh}kv{nkv}-d{d}-bs{bs}-n{len(lens)}"
            f"{'-alibi' if alibi else ''}{'-' + layout if layout else ''}"
            f"{'-' + str(c[9]) if len(c) > 9 and isinstance(c[9], str) else ''}"
            f"{'-blocksparse' if len(c) > 9 and isinstance(c[9], Blocksparse) else ''}")


def storage_bytes(t):
    """The bytes of t's storage from its first element to the storage's end."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((n,), (1,), t.storage_offset()).view(torch.uint8).numpy().tobytes()


def write_case(path, name, inp, sparse=testing.DENSE):
    """inp: testing.AttentionInputs (vLLM's layout) or testing.DecodeInputs (token-major);
    sparse: a validation.Blocksparse for an attention case."""
    token_major = isinstance(inp, testing.DecodeInputs)
    if token_major:
        out = torch.full((inp.num_seqs, inp.num_heads, inp.head_size), float("nan"),
                         dtype=inp.dtype)
        want = testing.call_decode(reference.decode, inp, out)
    else:
        want = testing.call_v2(reference.paged_attention_v2, inp,
                               testing.alloc_v2_outputs(inp), sparse).out
    atol, rtol = testing.tolerances(inp.dtype, inp.kv_cache_dtype)
    k, v = inp.key_cache, inp.value_cache
    # token-major [blocks, block_size, kv_heads, d]; vLLM's K [blocks, kv_heads, ...] (its token
    # stride follows from its contiguous inner dims: written as 0)
    strides = {"k": (k.stride(0), k.stride(2), k.stride(1)) if token_major
               else (k.stride(0), k.stride(1), 0),
               "v": (v.stride(0), v.stride(2), v.stride(1)) if token_major
               else (v.stride(0), v.stride(1), 0)}
    kb, vb = storage_bytes(k), storage_bytes(v)
    ints = dict(scalar_kind=SCALAR_KIND[inp.dtype],
                cache_kind=CACHE_KIND[parse_kv_cache_dtype("cross", inp.kv_cache_dtype)],
                num_seqs=inp.num_seqs, num_heads=inp.num_heads, num_kv_heads=inp.num_kv_heads,
                head_size=inp.head_size, block_size=inp.block_size, x=key_chunk_elements(k.dtype),
                max_blocks_per_seq=inp.block_tables.shape[1], num_blocks=k.shape[0],
                has_alibi=int(inp.alibi_slopes is not None),
                kv_form=KV_FORM["token_major" if token_major else "vllm"],
                k_block_stride=strides["k"][0], k_head_stride=strides["k"][1],
                k_token_stride=strides["k"][2], v_block_stride=strides["v"][0],
                v_head_stride=strides["v"][1], v_token_stride=strides["v"][2],
                k_bytes=len(kb), v_bytes=len(vb), name_len=len(name),
                bs_tp_rank=sparse.tp_rank, bs_local_blocks=sparse.local_blocks,
                bs_vert_stride=sparse.vert_stride if sparse != testing.DENSE else 0,
                bs_block_size=sparse.block_size, bs_head_sliding_step=sparse.head_sliding_step)
    f32 = lambda t: t.float().contiguous().numpy().tobytes()  # noqa: E731
    i32 = lambda t: t.to(torch.int32).contiguous().numpy().tobytes()  # noqa: E731
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack(f"<{len(HEADER_INTS)}q", *(ints[n] for n in HEADER_INTS)))
        f.write(struct.pack("<5f", inp.scale, float(inp.k_scale), float(inp.v_scale), atol, rtol))
        f.write(name.encode())
        for blob in (f32(inp.query), kb, vb, i32(inp.block_tables), i32(inp.seq_lens)):
            f.write(blob)
        if inp.alibi_slopes is not None:
            f.write(f32(inp.alibi_slopes))
        f.write(f32(want))


def write_cases(folder, cases=CASES):
    """Writes every case of `cases` (CASES' form) to folder/<name>.case; returns their number."""
    assert sys.byteorder == "little"
    os.makedirs(folder, exist_ok=True)
    for old in os.listdir(folder):
        if old.endswith(".case"):
            os.remove(os.path.join(folder, old))
    for i, c in enumerate(cases):
        dtype, kv, nh, nkv, d, bs, lens, alibi, layout = c[:9]
        sparse = c[9] if len(c) > 9 and isinstance(c[9], Blocksparse) else testing.DENSE
        if len(c) > 9 and c[9] in testing.EVERY_BYTE_SIDES:  # every_byte_case
            inp, _ = testing.every_fp8_byte_inputs(kv, c[9], layout or "vllm")
            assert (inp.dtype, inp.num_heads, inp.num_kv_heads, inp.head_size, inp.block_size,
                    inp.seq_lens_list) == (dtype, nh, nkv, d, bs, lens), c
        elif layout in testing.DECODE_LAYOUTS:
            inp = testing.make_decode_inputs(len(lens), nh, nkv, d, bs, lens, layout=layout,
                                             dtype=dtype, kv_cache_dtype=kv, use_alibi=alibi,
                                             seed=i + d)
        else:
            inp = testing.make_attention_inputs(len(lens), nh, nkv, d, bs, lens, dtype=dtype,
                                                kv_cache_dtype=kv, use_alibi=alibi, seed=i + d)
            if layout:
                inp = testing.with_strided_caches(inp, layout)
            if sparse != testing.DENSE:
                inp = poison_skipped(inp, blocksparse_mask(inp, sparse))
        name = case_name(i, c)
        write_case(os.path.join(folder, name + ".case"), name, inp, sparse)
    return len(cases)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} CASE_DIR   (writes the cross-test cases there)")
    print(f"{write_cases(sys.argv[1])} cases written to {sys.argv[1]}")
