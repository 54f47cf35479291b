"""csrc/core/fp8.h against torch, bit for bit.

The header is framework-free, so the test compiles a tiny C++ driver around it (g++, ~1 s) that
decodes all 256 bytes of each format and encodes float bit patterns read from stdin. Decode is
checked exhaustively; encode on every fp8 value, every midpoint between neighbours (ties) and the
floats one ulp either side, subnormals, signed zeros, +-inf, NaN, values beyond the max and many
random floats of all magnitudes — against torch's `x.clamp(-max, max).to(float8)`.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRIVER = r"""
#include "core/fp8.h"
#include <cstdio>
#include <cstdint>
#include <cstring>
using namespace paged_attn::fp8;
static uint32_t bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
int main() {
  for (int b = 0; b < 256; ++b)
    std::printf("%08x %08x\n", bits(e4m3_to_float((uint8_t)b)), bits(e5m2_to_float((uint8_t)b)));
  unsigned u;
  while (std::scanf("%x", &u) == 1) {
    float f; std::memcpy(&f, &u, 4);
    std::printf("%02x %02x\n", float_to_e4m3(f), float_to_e5m2(f));
  }
  return 0;
}
"""

FORMATS = {  # name -> (torch dtype, finite max, column in the driver's output)
    "e4m3fn": (torch.float8_e4m3fn, 448.0, 0),
    "e5m2": (torch.float8_e5m2, 57344.0, 1),
}


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("fp8")
    src, exe = d / "fp8_driver.cpp", d / "fp8_driver"
    src.write_text(DRIVER)
    subprocess.run([cxx, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"), str(src), "-o",
                    str(exe)], check=True)

    def run(floats: torch.Tensor):
        """-> (decode table int32 [256, 2] as float bits, encodes uint8 [n, 2])"""
        words = floats.contiguous().view(torch.int32).numpy().view(np.uint32)
        stdin = "\n".join(f"{w:08x}" for w in words)
        out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True,
                             check=True).stdout.split("\n")
        table = np.array([[int(t, 16) for t in line.split()] for line in out[:256]],
                         dtype=np.uint32)
        enc = np.array([[int(t, 16) for t in line.split()] for line in out[256:] if line],
                       dtype=np.uint8).reshape(-1, 2)
        return table, enc

    return run


def _torch_decode_all(dtype):
    return torch.arange(256, dtype=torch.uint8).view(dtype).float()


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_all_256_bytes(driver, fmt):
    dtype, _, col = FORMATS[fmt]
    table, _ = driver(torch.zeros(0))
    ours = torch.from_numpy(table[:, col].view(np.float32).copy())
    ref = _torch_decode_all(dtype)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(ours), nan)
    # sign of NaN too (the sign bit must survive), and every finite / inf value exactly
    assert torch.equal(torch.signbit(ours), torch.signbit(ref))
    assert torch.equal(ours[~nan], ref[~nan])
    assert nan.sum() == (2 if fmt == "e4m3fn" else 6)


def _encode_cases(dtype, fp8_max, n_random=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    vals = _torch_decode_all(dtype)
    finite = torch.sort(torch.unique(vals[torch.isfinite(vals)]))[0].double()
    mids = ((finite[1:] + finite[:-1]) / 2).float()  # exact in fp32: one extra mantissa bit
    around = torch.cat([mids, finite.float()])
    bits = around.view(torch.int32)
    ulps = torch.cat([(bits + 1).view(torch.float32), (bits - 1).view(torch.float32)])
    ulps = ulps[torch.isfinite(ulps)]
    edges = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"),
                          fp8_max, -fp8_max, fp8_max * 1.0001, fp8_max * 1.07, 1e30, -1e30,
                          1e-30, -1e-30, 1.4e-45, 3e-38, 1e-45])
    # random magnitudes over the whole float range, and dense around fp8's range
    rand_bits = torch.randint(-2**31, 2**31 - 1, (n_random,), generator=g, dtype=torch.int64)
    rand_any = rand_bits.to(torch.int32).view(torch.float32)
    rand_near = torch.randn(n_random, generator=g) * torch.exp2(
        torch.randint(-24, 18, (n_random,), generator=g).float())
    xs = torch.cat([around, -around, ulps, -ulps, edges, rand_any, rand_near])
    return xs


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_matches_torch_clamp_then_cast(driver, fmt):
    dtype, fp8_max, col = FORMATS[fmt]
    xs = _encode_cases(dtype, fp8_max)
    _, enc = driver(xs)
    ours = torch.from_numpy(enc[:, col].copy())
    ref = xs.clamp(-fp8_max, fp8_max).to(dtype).view(torch.uint8)
    ref_nan = torch.isnan(ref.view(dtype).float())
    ours_f = ours.view(dtype).float()
    # NaN must stay NaN (which NaN byte is not part of the contract)
    assert torch.equal(torch.isnan(ours_f), ref_nan)
    bad = (ours != ref) & ~ref_nan
    assert not bad.any(), (
        f"{int(bad.sum())} mismatches, e.g. x={xs[bad][:5].tolist()} "
        f"ours={ours[bad][:5].tolist()} torch={ref[bad][:5].tolist()}")
    # saturation: never produces NaN/inf from a non-NaN input
    assert torch.isfinite(ours_f[~torch.isnan(xs)]).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_decode_round_trip(driver, fmt):
    """Every finite fp8 value encodes back to its own byte (except -0 / +0 identity)."""
    dtype, _, col = FORMATS[fmt]
    vals = _torch_decode_all(dtype)
    keep = torch.isfinite(vals)
    _, enc = driver(vals[keep])
    assert torch.equal(torch.from_numpy(enc[:, col].copy()),
                       torch.arange(256, dtype=torch.uint8)[keep])
