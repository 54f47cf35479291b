"""Cache-write cases (reshape_and_cache, reshape_and_cache_flash): the tokens, slots and caches of
each, for tools.conformance.cache_write (the backend's bytes against the oracle's).

Every source gives key / value of a query dtype, caches of a kv_cache_dtype and k_scale / v_scale
(floats or 0-dim tensors on the device):
  fused-random   key / value slices of a fused qkv tensor whose rows past the slots are NaN
                 CUDA-graph padding, values x30 (fp8 saturates), one NaN element, every 4th slot
                 padding (-1), random caches
  fused-prefill  the same with slots as prefills write them (prefill_slots)
  poisoned-some  caches of testing.make_attention_inputs (NaN in every unused slot), every 3rd
                 slot padding, the first included
  poisoned-all   the same with every slot padding: nothing may change
  zero-caches    4 KV heads of head size 80 x100 (fp8 saturates), zeroed caches, int64 slots
"""

import torch

from paged_attention_ext.core import key_chunk_elements
from paged_attention_ext.tools import testing

# (query dtype, kv_cache_dtype): every query dtype with every cache kind ("fp8" is e4m3)
DTYPE_KV = [(dtype, kv) for kv in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
            for dtype in (torch.float32, torch.bfloat16, torch.float16)]
# a pair per query dtype and cache kind: the CPU's threaded writes and the flash layouts
DTYPE_KV_FEW = [(torch.float32, "auto"), (torch.bfloat16, "auto"), (torch.float16, "auto"),
                (torch.float32, "fp8"), (torch.bfloat16, "fp8_e4m3"), (torch.float16, "fp8_e5m2")]
SOURCES = ("fused-random", "fused-prefill", "poisoned-some", "poisoned-all", "zero-caches")


def dtype_kv_id(pair):
    return f"{str(pair[0])[6:]}-{pair[1]}"


def prefill_slots(num_tokens, num_blocks, bs, g):
    """Slots as prefills write them: sequences of consecutive tokens, each starting mid-block and
    going on into its next block (the first sequence's blocks adjacent in the pool, so its slot
    numbers run on across a block boundary; the others' blocks shuffled), every 7th token
    padding (-1). Each block belongs to one sequence: no slot is written twice."""
    blocks = [0, 1, 2] + (torch.randperm(num_blocks - 3, generator=g) + 3).tolist()
    slots, first = [], True
    while len(slots) < num_tokens:
        block, offset = blocks.pop(0), int(torch.randint(0, bs, (), generator=g))
        length = int(torch.randint(1, 3 * bs, (), generator=g))
        if first:  # from block 0's last-but-one slot through block 1 into block 2
            offset, length, first = bs - 2, bs + 3, False
        for _ in range(length):
            if offset == bs:
                block, offset = blocks.pop(0), 0
            slots.append(block * bs + offset)
            offset += 1
    slots = torch.tensor(slots[:num_tokens])
    slots[6::7] = -1
    runs_on = (slots[1:] == slots[:-1] + 1) & (slots[:-1] >= 0)
    assert runs_on.any() and (runs_on & (slots[1:] % bs == 0)).any()  # across a block boundary
    return slots


SLOTS = {  # slot kind -> slots(num_tokens, num_blocks, block_size, generator)
    "random": lambda n, nb, bs, g: torch.randperm(nb * bs, generator=g)[:n].masked_fill(
        torch.arange(n) % 4 == 0, -1),  # padding tokens are skipped
    "prefill": prefill_slots,
}


def _random_caches(shapes, cache_dtype, g):
    if cache_dtype == torch.uint8:
        return [torch.randint(0, 256, s, generator=g).to(torch.uint8) for s in shapes]
    return [torch.randn(*s, generator=g).to(cache_dtype) for s in shapes]


def _fused_key_value(num_rows, num_tokens, kvh, d, dtype, g):
    """key / value [num_rows, kvh, d]: slices of a fused [rows, (q + k + v) heads * d] tensor
    (stride(0) > kvh * d) whose rows from num_tokens on are NaN; one NaN in token 0's key."""
    fused = torch.randn(num_rows, (4 + 2 * kvh) * d, generator=g) * 30  # fp8 saturates too
    fused[0, 4 * d] = float("nan")
    fused[num_tokens:] = float("nan")
    fused = fused.to(dtype)
    return (fused[:, 4 * d:(4 + kvh) * d].view(num_rows, kvh, d),
            fused[:, (4 + kvh) * d:].view(num_rows, kvh, d))


def _scales(kv, as_tensor, device, k_scale=0.37, v_scale=1.9):
    if kv == "auto":
        k_scale, v_scale = 1.0, 1.0
    if as_tensor:
        return torch.tensor(float(k_scale), device=device), torch.tensor(float(v_scale),
                                                                         device=device)
    return k_scale, v_scale


def reshape_and_cache_case(source, dtype, kv, scale_as_tensor, device="cpu"):
    """(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale) of
    `source` (SOURCES) in vLLM's cache layout."""
    cache_dtype = dtype if kv == "auto" else torch.uint8
    x = key_chunk_elements(cache_dtype)
    if source.startswith("fused-"):
        num_tokens, kvh, d, bs, num_blocks = 37, 2, 48, 5, 24
        g = torch.Generator().manual_seed(5)
        # slot_mapping has num_tokens entries, key / value 3 rows more (vLLM's graph padding)
        key, value = _fused_key_value(num_tokens + 3, num_tokens, kvh, d, dtype, g)
        slots = SLOTS[source[len("fused-"):]](num_tokens, num_blocks, bs, g)
        kc, vc = _random_caches([(num_blocks, kvh, d // x, bs, x), (num_blocks, kvh, d, bs)],
                                cache_dtype, torch.Generator().manual_seed(6))
        k_scale, v_scale = _scales(kv, scale_as_tensor, device)
    elif source.startswith("poisoned-"):
        inputs = testing.make_attention_inputs(2, 4, 2, 64, 16, [30, 17], dtype=dtype,
                                               kv_cache_dtype=kv, seed=7)
        num_tokens = 13
        g = torch.Generator().manual_seed(1)
        key = torch.randn(num_tokens + 2, 2, 64, generator=g).to(dtype) * 3
        value = torch.randn(num_tokens + 2, 2, 64, generator=g).to(dtype) * 3
        key[num_tokens:], value[num_tokens:] = float("nan"), float("nan")  # padding rows (vLLM)
        slots = torch.randperm(inputs.num_blocks * 16, generator=g)[:num_tokens]
        slots[::3] = -1  # padding tokens, including the first
        if source == "poisoned-all":
            slots[:] = -1
        kc, vc = inputs.key_cache, inputs.value_cache
        k_scale, v_scale = _scales(kv, scale_as_tensor, device, inputs.k_scale, inputs.v_scale)
    elif source == "zero-caches":
        num_tokens, kvh, d, bs, num_blocks = 37, 4, 80, 16, 9
        g = torch.Generator().manual_seed(7)
        key = (torch.randn(num_tokens, kvh, d, generator=g) * 100).to(dtype)  # some saturate
        value = torch.randn(num_tokens, kvh, d, generator=g).to(dtype)
        slots = torch.randperm(num_blocks * bs, generator=g)[:num_tokens]
        slots[::5] = -1  # padding tokens
        kc = torch.zeros(num_blocks, kvh, d // x, bs, x, dtype=cache_dtype)
        vc = torch.zeros(num_blocks, kvh, d, bs, dtype=cache_dtype)
        k_scale, v_scale = _scales(kv, scale_as_tensor, device)
    else:
        raise ValueError(f"unknown source {source!r}; choose from {SOURCES}")
    return (key.to(device), value.to(device), kc.to(device), vc.to(device),
            slots.to(torch.int64).to(device), kv, k_scale, v_scale)


def flash_case(slot_kind, layout, dtype, kv, device="cpu"):
    """(key, value, key_cache, value_cache, slot_mapping) for reshape_and_cache_flash: key /
    value with more rows than slot_mapping (vLLM: the rest is padding, never read: NaN there),
    slices of a fused tensor; slots of SLOTS[slot_kind]; random token-major caches laid out as
    `layout` (testing.DECODE_LAYOUTS)."""
    num_rows, num_tokens, kvh, d, bs, num_blocks = 41, 37, 2, 48, 5, 24
    g = torch.Generator().manual_seed(5)
    key, value = _fused_key_value(num_rows, num_tokens, kvh, d, dtype, g)
    slots = SLOTS[slot_kind](num_tokens, num_blocks, bs, g)
    k, v = _random_caches([(num_blocks, bs, kvh, d)] * 2, dtype if kv == "auto" else torch.uint8,
                          torch.Generator().manual_seed(6))
    kc, vc, _ = testing.nhd_cache_views(k.to(device), v.to(device), layout)
    return key.to(device), value.to(device), kc, vc, slots.to(device)


def flash_scales(device="cpu"):
    """The scales each flash case writes with, one write on top of the other: floats, then
    0-dim tensors."""
    return ((0.37, 1.9), (torch.tensor(0.37, device=device), torch.tensor(1.9, device=device)))
