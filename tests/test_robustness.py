"""Robustness beyond the bad-input rules: 64-bit block offsets on a pool larger than 2^31
elements, run-to-run determinism, thread-count independence, tensors on mixed devices."""

import dataclasses

import pytest
import torch

from paged_attention_ext.tools import backends, conformance, testing

BACKEND_NAMES = backends.backend_names("cpu")  # the CPU backends by name (tools.backends)


def _large_pool_inputs(dtype, kv_cache_dtype):
    """One sequence whose blocks sit past element 2^31 of each cache (plus one near the start).

    The caches are torch.empty: only the blocks written here are ever touched, so the ~2-4 GiB
    per cache is virtual memory, not resident."""
    head_size, block_size, num_kv_heads = 128, 16, 1
    small = testing.make_attention_inputs(1, 4, num_kv_heads, head_size, block_size, [61],
                                          dtype=dtype, kv_cache_dtype=kv_cache_dtype, seed=5)
    block_elems = num_kv_heads * head_size * block_size
    num_blocks = 2**31 // block_elems + 8
    key_cache = torch.empty((num_blocks,) + tuple(small.key_cache.shape[1:]),
                            dtype=small.key_cache.dtype)
    value_cache = torch.empty((num_blocks,) + tuple(small.value_cache.shape[1:]),
                              dtype=small.value_cache.dtype)
    far = [num_blocks - 1, 3, num_blocks - 5, num_blocks - 2]  # offsets > 2^31 elements but one
    assert far[0] * block_elems > 2**31
    for i, b in enumerate(far):
        key_cache[b] = small.key_cache[int(small.block_tables[0, i])]
        value_cache[b] = small.value_cache[int(small.block_tables[0, i])]
    block_tables = torch.tensor([far + [-1]], dtype=torch.int32)
    small.key_cache, small.value_cache, small.block_tables = key_cache, value_cache, block_tables
    small.num_blocks = num_blocks
    return small


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("dtype,kv_cache_dtype", [(torch.bfloat16, "auto"),
                                                  (torch.float32, "fp8_e4m3")])
def test_block_offsets_beyond_int32(backend, dtype, kv_cache_dtype):
    inputs = _large_pool_inputs(dtype, kv_cache_dtype)
    conformance.require(*conformance.attention(backends.backend(backend).ops, inputs))


def _llama_like(seed):
    return testing.make_attention_inputs(3, 16, 4, 128, 16, [1500, 70, 1025],
                                         dtype=torch.bfloat16, seed=seed)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_bitwise_deterministic_run_to_run(backend):
    impl = backends.backend(backend).ops
    inputs = _llama_like(21)
    first = testing.call_v2(impl.v2, inputs, testing.alloc_v2_outputs(inputs))
    for _ in range(3):
        again = testing.call_v2(impl.v2, inputs, testing.alloc_v2_outputs(inputs))
        assert torch.equal(again.out, first.out)
    v1_first = testing.call_v1(impl.v1, inputs, testing.alloc_v1_outputs(inputs))
    v1_again = testing.call_v1(impl.v1, inputs, testing.alloc_v1_outputs(inputs))
    assert torch.equal(v1_first, v1_again)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_one_and_two_threads_agree(backend):
    impl = backends.backend(backend).ops
    inputs = _llama_like(22)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = testing.call_v2(impl.v2, inputs, testing.alloc_v2_outputs(inputs))
        torch.set_num_threads(2)
        two = testing.call_v2(impl.v2, inputs, testing.alloc_v2_outputs(inputs))
    finally:
        torch.set_num_threads(threads)
    testing.assert_v2_matches(two, one, inputs.seq_lens_list, inputs.dtype)


@pytest.mark.parametrize("misplaced", ["key_cache", "block_tables", "out"])
def test_mixed_devices_rejected(misplaced):
    # The meta device stands in for a second device on a machine without a GPU.
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [9, 20], seed=23)
    out = testing.alloc_v1_outputs(inputs)
    if misplaced == "out":
        out = out.to("meta")
    else:
        setattr(inputs, misplaced, getattr(inputs, misplaced).to("meta"))
    with pytest.raises((ValueError, RuntimeError), match=rf"{misplaced}.*device|device.*{misplaced}"):
        testing.call_v1(torch.ops.paged_attn.v1, inputs, out)


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("num_heads,seq_lens", [(8, []), (0, [37, 5])],
                         ids=["no_rows", "no_heads"])
def test_empty_batch(backend, num_heads, seq_lens):
    """No output elements: num_seqs = 0 (a step with no decode rows) or num_heads = 0, and
    num_tokens = 0: every op returns and writes nothing (the fallback once divided by the batch
    size and the head count here, the C++ kernel by the GQA group: a SIGFPE)."""
    impl = backends.backend(backend).ops
    num_seqs = len(seq_lens)
    inputs = testing.make_attention_inputs(num_seqs, num_heads, 2, 64, 16, seq_lens, seed=4)
    conformance.require(*conformance.attention(impl, inputs))
    dec = testing.make_decode_inputs(num_seqs, num_heads, 2, 64, 16, seq_lens, layout="hnd",
                                     seed=4)
    conformance.require(*conformance.decode(impl, dec))
    key_cache, value_cache = inputs.key_cache.clone(), inputs.value_cache.clone()
    no_tokens = torch.empty(0, 2, 64)
    impl.reshape_and_cache(no_tokens, no_tokens, key_cache, value_cache,
                           torch.empty(0, dtype=torch.int64), "auto", 1.0, 1.0)
    assert torch.equal(key_cache.nan_to_num(7.0), inputs.key_cache.nan_to_num(7.0))
    assert torch.equal(value_cache.nan_to_num(7.0), inputs.value_cache.nan_to_num(7.0))


@pytest.mark.parametrize("backend", BACKEND_NAMES)
@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "bfloat16"), (torch.float16, "float16")])
def test_vllm_unquantized_cache_names_mean_auto(backend, dtype, name):
    """vLLM hands its kernels --kv-cache-dtype as given: "bfloat16" / "float16" name an
    unquantized cache, computed exactly as "auto"."""
    impl = backends.backend(backend).ops
    inputs = testing.make_attention_inputs(2, 8, 2, 64, 16, [600, 7], dtype=dtype, seed=9)
    named = dataclasses.replace(inputs, kv_cache_dtype=name)
    for call, alloc in ((testing.call_v1, testing.alloc_v1_outputs),
                        (testing.call_v2, testing.alloc_v2_outputs)):
        op = impl.v1 if call is testing.call_v1 else impl.v2
        want, got = call(op, inputs, alloc(inputs)), call(op, named, alloc(named))
        for w, g in zip(want if isinstance(want, tuple) else (want,),
                        got if isinstance(got, tuple) else (got,)):
            assert torch.equal(w.nan_to_num(7.0), g.nan_to_num(7.0))
    dec = testing.make_decode_inputs(2, 8, 2, 64, 16, [600, 7], layout="hnd", dtype=dtype, seed=9)
    want = testing.call_decode(impl.decode, dec, testing.alloc_v1_outputs(dec))
    got = testing.call_decode(impl.decode, dataclasses.replace(dec, kv_cache_dtype=name),
                              testing.alloc_v1_outputs(dec))
    assert torch.equal(want, got)
    key = torch.randn(5, 2, 64).to(dtype)
    slots = torch.tensor([3, -1, 40, 17, 0])
    for op, (k_cache, v_cache) in (("reshape_and_cache", (inputs.key_cache, inputs.value_cache)),
                                   ("reshape_and_cache_flash", (dec.key_cache, dec.value_cache))):
        written = []
        for kv in ("auto", name):
            kc, vc = conformance.same_layout_copy(k_cache), conformance.same_layout_copy(v_cache)
            getattr(impl, op)(key, key, kc, vc, slots, kv, 1.0, 1.0)
            written.append((kc.view(torch.uint8), vc.view(torch.uint8)))
        assert all(torch.equal(a, b) for a, b in zip(*written))
