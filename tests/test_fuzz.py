"""Property-based tests: hypothesis draws shapes and contents within the contract (vLLM's
layout for v1 / v2 / reshape_and_cache, every NHD / HND form for decode) and every CPU backend
must agree with the oracle: each compiled CPU kernel variant this machine executes (forced and
checked, the `backend` fixture of conftest.py) and the fallback. The CUDA kernels take only their
compiled head sizes and aligned caches (test_conformance.py runs them).

Example counts: the "ci" profile (default) runs a bounded number per test, derandomized so that
a CI run is reproducible; the "deep" profile draws fresh random examples, many more:
    HYPOTHESIS_PROFILE=deep bash scripts/test.sh tests/test_fuzz.py
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paged_attention_ext.core import cache_kind, cache_storage_dtype, key_chunk_elements
from paged_attention_ext.tools import conformance, testing

# function_scoped_fixture: the `backend` fixture only chooses the backend, the same for every
# example of a test.
_HEALTH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True,
                          suppress_health_check=_HEALTH)
settings.register_profile("deep", max_examples=400, deadline=None, suppress_health_check=_HEALTH)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Lengths around block and partition edges, plus anything up to three partitions.
EDGE_LENGTHS = [0, 1, 2, 15, 16, 17, 511, 512, 513, 1023, 1024, 1025]
pytestmark = pytest.mark.backends(cuda=False)


@st.composite
def attention_cases(draw):
    dtype_name = draw(st.sampled_from(sorted(DTYPES)))
    kv_cache_dtype = draw(st.sampled_from(["auto", "auto", "fp8", "fp8_e4m3", "fp8_e5m2"]))
    x = key_chunk_elements(cache_storage_dtype(cache_kind(kv_cache_dtype, "fuzz"),
                                               DTYPES[dtype_name]))
    num_kv_heads = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4, 6, 8]))
    head_size = x * draw(st.integers(1, max(1, 160 // x)))
    block_size = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 32]))
    num_seqs = draw(st.integers(1, 4))
    length = st.one_of(st.sampled_from(EDGE_LENGTHS), st.integers(0, 1600))
    seq_lens = draw(st.lists(length, min_size=num_seqs, max_size=num_seqs))
    return dict(
        num_seqs=num_seqs, num_heads=num_kv_heads * group, num_kv_heads=num_kv_heads,
        head_size=head_size, block_size=block_size, seq_lens=seq_lens, dtype=DTYPES[dtype_name],
        kv_cache_dtype=kv_cache_dtype, use_alibi=draw(st.booleans()),
        noncontig_query=draw(st.booleans()), scale_as_tensor=draw(st.booleans()),
        extra_blocks=draw(st.integers(0, 4)), seed=draw(st.integers(0, 2**31 - 1)))


def _partitions_with_extra(inputs, extra):
    """v2 scratch larger than needed (vLLM sizes it from max_seq_len over the whole batch)."""
    return max(1, max(map(testing.num_partitions, inputs.seq_lens_list))) + extra


@given(case=attention_cases(), extra_partitions=st.integers(0, 2))
def test_v2_matches_oracle(backend, case, extra_partitions):
    inputs = testing.make_attention_inputs(**case)
    conformance.require(conformance.v2(backend.ops, inputs,
                                       _partitions_with_extra(inputs, extra_partitions))[0])


@given(case=attention_cases())
def test_v1_matches_oracle(backend, case):
    inputs = testing.make_attention_inputs(**case)
    conformance.require(conformance.v1(backend.ops, inputs))


@st.composite
def decode_cases(draw):
    """attention_cases over NHD / HND caches (testing.DECODE_LAYOUTS: plain, transposed,
    combined K/V, mixed and padded strides), with the GQA groups and KV-head counts the
    token-major kernels tile differently (head tiles of up to 6 / 8 / 16 heads, several KV heads
    an item) and head sizes that leave a partial last 32-dim chunk."""
    case = draw(attention_cases())
    num_kv_heads = draw(st.integers(1, 6))
    group = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16]))
    case.update(num_kv_heads=num_kv_heads, num_heads=num_kv_heads * group,
                layout=draw(st.sampled_from(testing.DECODE_LAYOUTS)))
    return case


@given(case=decode_cases(), against_v1=st.booleans())
def test_decode_matches_oracle(backend, case, against_v1):
    inputs = testing.make_decode_inputs(**case)
    conformance.require(*conformance.decode(backend.ops, inputs, against_v1))


@pytest.mark.backends(cpu_variants=False, cuda=False)  # one CPU cache writer
@given(data=st.data())
def test_reshape_and_cache_matches_oracle(backend, data):
    dtype = data.draw(st.sampled_from(sorted(DTYPES)).map(DTYPES.get))
    kv_cache_dtype = data.draw(st.sampled_from(["auto", "fp8_e4m3", "fp8_e5m2"]))
    inputs = testing.make_attention_inputs(
        1, 2, data.draw(st.integers(1, 2)), 32, data.draw(st.sampled_from([1, 5, 16])), [40],
        dtype=dtype, kv_cache_dtype=kv_cache_dtype, extra_blocks=2,
        seed=data.draw(st.integers(0, 2**31 - 1)))
    num_slots = inputs.num_blocks * inputs.block_size
    num_tokens = data.draw(st.integers(0, 12))
    # distinct slots (a slot written twice in one call has no defined winner), some padding (-1)
    slots = data.draw(st.lists(st.integers(0, num_slots - 1), min_size=num_tokens,
                               max_size=num_tokens, unique=True))
    slots = [s if data.draw(st.booleans()) or s % 3 else -1 for s in slots]
    # key and value slices of a fused [num_tokens, 3, kv_heads, head] tensor (strided dim 0);
    # values up to +-1000 exercise fp8 saturation (e4m3 max 448)
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1)))  # replayable
    fused = torch.randn(num_tokens, 3, inputs.num_kv_heads, 32, generator=generator)
    fused = fused.mul_(300).to(dtype)
    key, value = fused[:, 0], fused[:, 2]
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    conformance.require(conformance.cache_write(  # bit-exact, NaN poison included
        backend.ops, "reshape_and_cache", key, value, inputs.key_cache,
        inputs.value_cache, slot_mapping, kv_cache_dtype, inputs.k_scale, inputs.v_scale))
