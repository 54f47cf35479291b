"""reshape_and_cache_flash (CONTRACT.md "NHD / HND caches"): every implementation against an
expectation written token by token here (fp8 bytes chosen from dense_reference's bit-level fp8
tables, not torch's float8 conversion), on every cache layout; and the round trip the ops exist
for: decode on caches filled by reshape_and_cache_flash equals v1 on v1-layout caches filled by
reshape_and_cache with the same K/V.
"""

from types import SimpleNamespace

import pytest
import torch

from support.dense_reference import FP8_TABLES
from paged_attention_ext import api, reference
from paged_attention_ext.tools import backends, testing

DTYPES = [  # (key dtype, kv_cache_dtype, scales as 0-dim tensors)
    (torch.float32, "auto", False),
    (torch.bfloat16, "auto", False),
    (torch.float16, "fp8_e4m3", True),
    (torch.bfloat16, "fp8_e5m2", False),
    (torch.float32, "fp8", True),
]
SATURATING = 6e4  # / k_scale, v_scale (0.37, 1.9) beyond both fp8 formats' max (448, 57344)


# The CPU backends by name (tools.backends): the compiled CPU kernel and the fallback called
# directly when _C is loaded, else the fallback through torch.ops.
CPU_BACKENDS = backends.backend_names("cpu")


def _ops(backend):
    """The op namespace of the backend named `backend`, or the oracle ("reference")."""
    if backend == "reference":
        return SimpleNamespace(reshape_and_cache=reference.reshape_and_cache,
                               reshape_and_cache_flash=reference.reshape_and_cache_flash,
                               v1=reference.paged_attention_v1, decode=reference.decode)
    return backends.backend(backend).ops


def _inputs(dtype, kv_cache_dtype, scale_as_tensor, layout, seed=0):
    """Poisoned caches (4 rows' worth of blocks, NaN everywhere no row uses) in `layout`."""
    return testing.make_decode_inputs(3, 4, 2, 32, 8, [20, 9, 0], layout=layout, dtype=dtype,
                                      kv_cache_dtype=kv_cache_dtype, seed=seed,
                                      scale_as_tensor=scale_as_tensor)


def _tokens(inputs, num_tokens, padding, seed=1):
    """key, value [num_tokens + 2, kvh, d] (the last 2 rows NaN: vLLM's CUDA-graph padding, not
    read), slot_mapping [num_tokens] of distinct slots, some -1 (the first one included), and two
    tokens with values beyond the fp8 range."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_tokens + 2, inputs.num_kv_heads, inputs.head_size)
    key, value = (torch.randn(shape, generator=gen) * 3 for _ in range(2))
    key[1, 0, :4] = torch.tensor([SATURATING, -SATURATING, 1e-3, 0.0])
    value[2, 1, :2] = torch.tensor([-SATURATING, SATURATING])
    key[num_tokens:], value[num_tokens:] = float("nan"), float("nan")
    slots = torch.randperm(inputs.num_blocks * inputs.block_size, generator=gen)[:num_tokens]
    if padding == "some":
        slots[::3] = -1
    elif padding == "all":
        slots[:] = -1
    return key.to(inputs.dtype), value.to(inputs.dtype), slots


def _encode_by_hand(x, kind, scale):
    """One token's values -> cache elements: as they are for "auto"; fp8: the byte whose value
    is nearest to x / scale (computed in fp32), a tie going to the even mantissa (round to
    nearest even), saturating at the largest finite value."""
    if kind == "auto":
        return x
    table = FP8_TABLES[kind]
    finite_bytes = torch.nonzero(torch.isfinite(table)).squeeze(1)  # [F]
    y = (x.float() / float(scale)).double().reshape(-1, 1)
    distance = (table[finite_bytes][None, :] - y).abs()  # [n, F]
    nearest = distance == distance.min(dim=1, keepdim=True).values
    # among the nearest (two at a tie: neighbours, one odd, one even), the even one first
    preference = nearest.to(torch.int32) * 2 + (finite_bytes[None, :] % 2 == 0).to(torch.int32)
    return finite_bytes[preference.argmax(dim=1)].to(torch.uint8).view(x.shape)


def _expected(before, rows, slots, kind, scale, block_size):
    """The cache view after the writes, token by token."""
    want = before.clone()
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            want[slot // block_size, slot % block_size] = _encode_by_hand(rows[i], kind, scale)
    return want


def _values(cache, kind):
    """Cache elements as float64 values (fp8 bytes through the bit-level tables)."""
    return cache.double() if kind == "auto" else FP8_TABLES[kind][cache.long()]


def _outside(storage, views):
    """The elements of `storage` no view covers (the padding of strided layouts)."""
    covered = torch.zeros(storage.shape, dtype=torch.bool)
    for v in views:
        if v.untyped_storage().data_ptr() == storage.untyped_storage().data_ptr():
            covered.as_strided(v.shape, v.stride(), v.storage_offset()).fill_(True)
    return storage[~covered]


@pytest.mark.parametrize("backend", ["reference", *CPU_BACKENDS])
@pytest.mark.parametrize("layout", testing.DECODE_LAYOUTS)
@pytest.mark.parametrize("dtype,kv_cache_dtype,scale_as_tensor", DTYPES,
                         ids=[f"{str(d)[6:]}-{k}" for d, k, _ in DTYPES])
@pytest.mark.parametrize("padding", ["some", "all"])
def test_matches_hand_written_expectation(backend, layout, dtype, kv_cache_dtype,
                                          scale_as_tensor, padding):
    inputs = _inputs(dtype, kv_cache_dtype, scale_as_tensor, layout)
    key, value, slots = _tokens(inputs, 11, padding)
    kind = "auto" if kv_cache_dtype == "auto" else kv_cache_dtype
    kind = "fp8_e4m3" if kind == "fp8" else kind
    want_k = _expected(inputs.key_cache, key, slots, kind, inputs.k_scale, inputs.block_size)
    want_v = _expected(inputs.value_cache, value, slots, kind, inputs.v_scale, inputs.block_size)
    outside = [_outside(s, (inputs.key_cache, inputs.value_cache)).clone() for s in inputs.storage]

    _ops(backend).reshape_and_cache_flash(key, value, inputs.key_cache, inputs.value_cache, slots,
                                          kv_cache_dtype, inputs.k_scale, inputs.v_scale)

    for got, want in ((inputs.key_cache, want_k), (inputs.value_cache, want_v)):
        torch.testing.assert_close(_values(got, kind), _values(want, kind), rtol=0, atol=0,
                                   equal_nan=True)
    if kind == "auto":  # bit for bit, NaN slots included
        assert torch.equal(inputs.key_cache.contiguous().view(torch.uint8),
                           want_k.contiguous().view(torch.uint8))
    elif slots[1] >= 0:  # token 1 saturated: the largest finite value, never NaN / inf
        fmax = torch.finfo(testing.FP8_DTYPES[kind]).max
        stored = _values(inputs.key_cache, kind)[slots[1] // 8, slots[1] % 8, 0, :2]
        assert stored.tolist() == [fmax, -fmax]
    for storage, before in zip(inputs.storage, outside):  # nothing written around the views
        torch.testing.assert_close(_outside(storage, (inputs.key_cache, inputs.value_cache)),
                                   before, rtol=0, atol=0, equal_nan=True)


def test_saturation_is_exercised():
    """The inputs above do reach the saturation: token 1 is live and beyond the fp8 range."""
    inputs = _inputs(torch.float32, "fp8_e4m3", False, "nhd")
    key, _, slots = _tokens(inputs, 11, "some")
    assert slots[1] >= 0 and key[1].abs().max() / testing.FP8_K_SCALE > 448


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_empty_and_all_padding_calls_write_nothing(backend):
    inputs = _inputs(torch.bfloat16, "auto", False, "hnd")
    before = [s.clone() for s in inputs.storage]
    fn = _ops(backend).reshape_and_cache_flash
    key, value, _ = _tokens(inputs, 4, "none")
    fn(key, value, inputs.key_cache, inputs.value_cache, torch.empty(0, dtype=torch.int64))
    fn(key, value, inputs.key_cache, inputs.value_cache, torch.full((4,), -1))
    for s, b in zip(inputs.storage, before):
        assert torch.equal(s.view(torch.uint8), b.view(torch.uint8))


# ---- the round trip: flash-filled NHD caches + decode = reshape_and_cache-filled caches + v1 ----

@pytest.mark.parametrize("backend", ["reference", *CPU_BACKENDS])
@pytest.mark.parametrize("layout", ["nhd", "hnd", "combined", "mixed"])
@pytest.mark.parametrize("dtype,kv_cache_dtype,scale_as_tensor",
                         [DTYPES[1], DTYPES[2], DTYPES[4]],
                         ids=["bfloat16-auto", "float16-fp8_e4m3", "float32-fp8"])
def test_decode_after_flash_equals_v1_after_reshape_and_cache(backend, layout, dtype,
                                                              kv_cache_dtype, scale_as_tensor):
    inputs = testing.make_decode_inputs(3, 8, 2, 64, 16, [700, 33, 0], layout=layout,
                                        dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                                        use_alibi=True, seed=3, scale_as_tensor=scale_as_tensor)
    legacy = inputs.legacy
    # New K/V for some tokens of every row (the last one included), at their slots.
    positions = [(0, 699), (0, 0), (0, 511), (0, 512), (1, 32), (1, 5)]
    slots = torch.tensor([int(inputs.block_tables[s, t // 16]) * 16 + t % 16
                          for s, t in positions] + [-1])
    gen = torch.Generator().manual_seed(4)
    key = (torch.randn(len(positions) + 1, 2, 64, generator=gen) * 2).to(dtype)
    value = (torch.randn(len(positions) + 1, 2, 64, generator=gen) * 2).to(dtype)
    ops = _ops(backend)
    write_v1, write_flash, v1, decode = (ops.reshape_and_cache, ops.reshape_and_cache_flash,
                                         ops.v1, ops.decode)
    write_v1(key, value, legacy.key_cache, legacy.value_cache, slots, kv_cache_dtype,
             legacy.k_scale, legacy.v_scale)
    write_flash(key, value, inputs.key_cache, inputs.value_cache, slots, kv_cache_dtype,
                inputs.k_scale, inputs.v_scale)
    # the two writes stored the same bytes
    for got, want in zip((inputs.key_cache, inputs.value_cache),
                         testing.legacy_to_nhd(legacy.key_cache, legacy.value_cache)):
        assert torch.equal(got.contiguous().view(torch.uint8), want.view(torch.uint8))
    want = testing.call_v1(v1, legacy, testing.alloc_v1_outputs(legacy))
    got = testing.call_decode(decode, inputs, testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(got, want, dtype, kv_cache_dtype, name="decode vs v1")
    oracle = testing.call_decode(reference.decode, inputs, testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(got, oracle, dtype, kv_cache_dtype, name="decode vs oracle")


# ---- the Python API ----

@pytest.mark.parametrize("kv_layout", ["nhd", "hnd"])
def test_api_round_trip(kv_layout):
    """allocate_paged_kv_cache + reshape_and_cache_flash + paged_decode in the storage order
    kv_layout names, against the oracle on the NHD views."""
    kc, vc = api.allocate_paged_kv_cache(6, 4, 2, 32, dtype=torch.float32, kv_layout=kv_layout)
    assert kc.shape == ((6, 4, 2, 32) if kv_layout == "nhd" else (6, 2, 4, 32))
    assert kc.is_contiguous() and not kc.any()
    gen = torch.Generator().manual_seed(0)
    key, value = torch.randn(10, 2, 32, generator=gen), torch.randn(10, 2, 32, generator=gen)
    # row 0: tokens 0..6 in blocks 5, 1; row 1: tokens 0..2 in block 3
    slots = torch.tensor([20, 21, 22, 23, 4, 5, 6, 12, 13, 14])
    api.reshape_and_cache_flash(key, value, kc, vc, slots, kv_layout=kv_layout)
    query = torch.randn(2, 4, 32, generator=gen)
    tables = torch.tensor([[5, 1], [3, -1]], dtype=torch.int32)
    lens = torch.tensor([7, 3], dtype=torch.int32)
    got = api.paged_decode(query, kc, vc, tables, lens, kv_layout=kv_layout, validate=True)
    views = (kc, vc) if kv_layout == "nhd" else (kc.transpose(1, 2), vc.transpose(1, 2))
    want = torch.full_like(got, float("nan"))
    reference.decode(want, query, *views, tables, lens, 32 ** -0.5, None)
    testing.assert_out_matches(got, want, torch.float32)
    assert torch.equal(views[0][5, 0], key[0]) and torch.equal(views[1][3, 2], value[9])


def test_api_rejects_unknown_layout():
    kc, vc = api.allocate_paged_kv_cache(2, 4, 1, 16, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"paged_decode: kv_layout must be 'nhd' or 'hnd'"):
        api.paged_decode(torch.randn(1, 1, 16), kc, vc, torch.zeros(1, 1, dtype=torch.int32),
                         torch.ones(1, dtype=torch.int32), kv_layout="nhwc")
    with pytest.raises(ValueError, match=r"allocate_paged_kv_cache: kv_layout"):
        api.allocate_paged_kv_cache(2, 4, 1, 16, kv_layout="HND ")
