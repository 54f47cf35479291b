"""The pipelined CUDA kernel's shared-memory stage (csrc/cuda/pipeline_config.cuh), checked on the
host for every instantiation the build compiles (element sizes 4 / 2 / 1, head-size capacities
32-256, head tiles 1 / 2 / 4 / 8, tensor cores on or off):

- vLLM V's swizzle (`PipelineConfig::v_offset`) is a bijection of the stage's V bytes that keeps
  every 16-byte unit whole, and unit u of 8 consecutive dims lands in 8 different 16-byte bank
  groups (the lane-per-dim reads and the ldmatrix rows are conflict-free);
- a tile of 16-bit (and fp32) tokens at head <= 128 holds a whole 32-byte sector of each vLLM V
  row, fp8 at least 16 tokens (the reason for the 16-token tiles: docs/PERFORMANCE.md,
  "NVIDIA H200");
- shared memory stays under the 99 KiB opt-in limit, and the head-128 bf16 tensor-core blocks of
  4 and 8 heads fit 3 to an H200 SM (228 KiB, 1 KiB reserved per block), as the launch bounds
  promise.
The kernel's use of these offsets runs in tests/test_cuda_host_sim.py.
"""

import subprocess
import textwrap

from support import host_cpp

HOST_PROGRAM = textwrap.dedent(r"""
    #include <cstdint>
    #include <cstdio>
    #include <vector>

    #include "cuda/pipeline_config.cuh"

    using namespace paged_attn::cuda;

    template <int kElem> struct Elem { unsigned char bytes[kElem]; };

    int failures = 0;
    #define CHECK(cond, ...) do { if (!(cond)) { ++failures; std::printf("FAIL " __VA_ARGS__); \
                                                 std::printf("\n"); } } while (0)

    template <int kElem, int kDimsPerLane, int kHeadTile, bool kMma>
    void check_one() {
      using Cfg = PipelineConfig<Elem<kElem>, kDimsPerLane, kHeadTile, 32, 4, kMma>;
      const int dims = Cfg::kMaxDims, row = Cfg::kVRowBytes;
      // the swizzle: a bijection of whole 16-byte units
      std::vector<int> hits(dims * row, 0);
      for (int d = 0; d < dims; ++d)
        for (int b = 0; b < row; ++b) {
          const int off = Cfg::v_offset(d, b);
          CHECK(off >= 0 && off < dims * row, "elem %d dims %d: offset %d out of the V tile",
                kElem, dims, off);
          if (off >= 0 && off < dims * row) ++hits[off];
          CHECK(off / 16 * 16 == Cfg::v_offset(d, b / 16 * 16) && off % 16 == b % 16,
                "elem %d dims %d: unit of (%d, %d) split", kElem, dims, d, b);
        }
      for (int h : hits) CHECK(h == 1, "elem %d dims %d: v_offset is not a bijection", kElem, dims);
      // unit u of 8 consecutive dims: 8 different bank groups
      for (int d0 = 0; d0 + 8 <= dims; d0 += 8)
        for (int u = 0; u < row / 16; ++u) {
          unsigned groups = 0;
          for (int d = d0; d < d0 + 8; ++d) groups |= 1u << ((Cfg::v_offset(d, 16 * u) / 16) % 8);
          CHECK(groups == 0xffu, "elem %d dims %d: dims %d.. unit %d share a bank group", kElem,
                dims, d0, u);
        }
      // whole V sectors where the K tile stays <= 4 KiB (head <= 128 for 16-bit caches)
      if (dims * kElem <= 256)
        CHECK(Cfg::kTileTokens * kElem >= 32 || Cfg::kTileTokens >= 16,
              "elem %d dims %d: %d-token tiles read half sectors of vLLM V", kElem, dims,
              Cfg::kTileTokens);
      CHECK(Cfg::kSmemBytes <= 99 * 1024, "elem %d dims %d heads %d: %d bytes", kElem, dims,
            kHeadTile, Cfg::kSmemBytes);
      if (kElem == 2 && dims == 128 && kMma)
        CHECK(3 * (Cfg::kSmemBytes + 1024) <= 228 * 1024,
              "bf16 head 128 tensor-core tile of %d heads: %d bytes, under 3 blocks per SM",
              kHeadTile, Cfg::kSmemBytes);
      std::printf("checked elem=%d dims=%d heads=%d mma=%d tile=%d stages=%d smem=%d\n", kElem,
                  dims, kHeadTile, kMma ? 1 : 0, Cfg::kTileTokens, Cfg::kStages, Cfg::kSmemBytes);
    }

    template <int kElem, int kDimsPerLane>
    void check_dims() {
      check_one<kElem, kDimsPerLane, 1, false>();
      check_one<kElem, kDimsPerLane, 2, false>();
      check_one<kElem, kDimsPerLane, 4, false>();
      check_one<kElem, kDimsPerLane, 8, false>();
      if constexpr (kElem <= 2) {
        check_one<kElem, kDimsPerLane, 4, true>();
        check_one<kElem, kDimsPerLane, 8, true>();
      }
    }

    template <int kElem>
    void check_elem() {
      check_dims<kElem, 1>();
      check_dims<kElem, 2>();
      check_dims<kElem, 3>();
      check_dims<kElem, 4>();
      check_dims<kElem, 6>();
      check_dims<kElem, 8>();
    }

    int main() {
      check_elem<4>();
      check_elem<2>();
      check_elem<1>();
      if (failures == 0) std::printf("OK\n");
      return failures == 0 ? 0 : 1;
    }
""")


def test_the_pipelined_stage_layout_holds_for_every_instantiation(tmp_path):
    exe = host_cpp.build(tmp_path, "pipeline_config_host", HOST_PROGRAM,
                         includes=(host_cpp.TESTS,))
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
    # the head-128 16-bit tiles: 16 tokens (whole 32-byte sectors of a 16-token block's V rows)
    assert "checked elem=2 dims=128 heads=4 mma=1 tile=16 " in run.stdout, run.stdout
    assert run.stdout.count("checked ") == 3 * 6 * 4 + 2 * 6 * 2, run.stdout
