"""What only the compiled CPU kernels (csrc/cpu) have: many Python threads calling them at once,
and cache writes split over OpenMP threads. Every variant against the oracle (each forced with
PAGED_ATTN_CPU_KERNEL and checked to be the one that runs) is tests/test_conformance.py; which
variant runs by default is tests/test_cpu_kernel_choice.py, the variants built without torch
(and NEON under qemu) tests/test_cpu_kernel_cross.py.
"""

import threading

import pytest
import torch

import paged_attention_ext
from paged_attention_ext import reference
from paged_attention_ext.tools import backends, conformance, testing
from support import cache_writes

pytestmark = pytest.mark.skipif(not paged_attention_ext.extension_loaded(),
                                reason=f"compiled extension: {paged_attention_ext.extension_status()}")

# The compiled CPU kernel by name (tools.backends: active only when _C's CPU kernels serve every
# op), or None where the extension is not loaded (every test here skips then).
OPS = backends.backend("cpu-kernel").ops if paged_attention_ext.extension_loaded() else None


def test_concurrent_python_threads():
    """Many Python threads calling the op at once (each with its own inputs) get correct results:
    the kernel keeps no shared mutable state."""
    inputs = [testing.make_attention_inputs(2, 8, 2, 64, 16, [300 + 37 * i, 700], seed=100 + i)
              for i in range(6)]
    expected = [testing.call_v2(reference.paged_attention_v2, inp,
                                testing.alloc_v2_outputs(inp)).out for inp in inputs]
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                out = testing.call_v1(OPS.v1, inputs[i], testing.alloc_v1_outputs(inputs[i]))
                testing.assert_out_matches(out, expected[i], torch.float32)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# ---- cache writes over threads ----

@pytest.fixture(params=["one thread", "a thread per token"])
def cache_write_threads(request, monkeypatch):
    """The writes on one thread, or split token by token over 4 threads (a run of consecutive
    slots cut at a thread's boundary)."""
    if request.param == "one thread":
        monkeypatch.setenv("PAGED_ATTN_CPU_KV_BYTES_PER_THREAD", str(1 << 40))
        yield
        return
    monkeypatch.setenv("PAGED_ATTN_CPU_KV_BYTES_PER_THREAD", "1")
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype,kv", cache_writes.DTYPE_KV_FEW,
                         ids=map(cache_writes.dtype_kv_id, cache_writes.DTYPE_KV_FEW))
@pytest.mark.parametrize("scale_as_tensor", [False, True])
@pytest.mark.parametrize("slot_kind", cache_writes.SLOTS)
def test_reshape_and_cache_over_threads(dtype, kv, scale_as_tensor, slot_kind,
                                        cache_write_threads):
    args = cache_writes.reshape_and_cache_case(f"fused-{slot_kind}", dtype, kv, scale_as_tensor)
    conformance.require(conformance.cache_write(OPS, "reshape_and_cache", *args))


@pytest.mark.parametrize("dtype,kv", cache_writes.DTYPE_KV_FEW,
                         ids=map(cache_writes.dtype_kv_id, cache_writes.DTYPE_KV_FEW))
@pytest.mark.parametrize("layout", testing.DECODE_LAYOUTS)
@pytest.mark.parametrize("slot_kind", cache_writes.SLOTS)
def test_reshape_and_cache_flash_over_threads(dtype, kv, layout, slot_kind, cache_write_threads):
    key, value, kc, vc, slots = cache_writes.flash_case(slot_kind, layout, dtype, kv)
    for k_scale, v_scale in cache_writes.flash_scales():
        written = conformance.cache_write(OPS, "reshape_and_cache_flash", key, value, kc, vc,
                                          slots, kv, k_scale, v_scale)
        kc, vc = conformance.require(written).actual  # the next write goes on top
