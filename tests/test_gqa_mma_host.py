"""The tensor-core GQA math of csrc/cuda/gqa_mma.cuh, run on the host with simulated lanes.

The pipelined CUDA kernel runs QK, the online softmax and P.V of a GQA group through
GqaMmaWarp, whose lane operations (mma.sync, shuffles, 16-bit packing) are an injected policy.
Here a C++ program runs that same header in 32 threads with a policy whose MMA follows the PTX
ISA's fragment layouts for mma.m16n8k16 / mma.m16n8k8 (16-bit A and B, fp32 accumulate;
tests/cuda_sim/mma_layout.h): every lane publishes its fragments, the full matrices are rebuilt
from them by the documented (row, col) of each element, and each lane takes its own accumulator
elements. The K and V fragments come through the header's FragmentsFromPairs (what the kernel
uses for fp8 caches; its ldmatrix path for 16-bit caches runs in tests/test_cuda_host_sim.py).
So the test proves
that the header's fragment indexing agrees with the documented layouts (which elements of K, V,
Q and P each lane feeds in) and that its softmax bookkeeping is right; what it cannot prove is
that the GPU's mma.sync matches the documentation (tests/test_conformance.py and
tests/test_cuda_kernels.py do, on a GPU).

Cases: bf16 and fp16; head sizes that fill whole 16-dim slices and ones that do not (120, 80)
with NaN in every shared-memory byte past the head size (K rows, V rows); 1-8 heads in the
group; tiles of 8, 16 and 32 tokens; several tiles with a sharp softmax (logits ~ N(0, 9)),
random per-(head, token) masks, tokens no head attends (zero K and V, as the kernel's
zero-filled copies leave them), a head that attends nothing. Checked against float64 attention
on the same 16-bit inputs: the normalised output (tolerance from rounding P to 16 bits), the
max (bit for bit) and the sum; and every (head, dim) of the output is held by exactly one lane.
"""

import subprocess
import textwrap

from support import host_cpp

HOST_PROGRAM = textwrap.dedent(r"""
    #include <barrier>
    #include <cmath>
    #include <cstdint>
    #include <cstdio>
    #include <cstring>
    #include <random>
    #include <thread>
    #include <vector>

    #include "cuda/gqa_mma.cuh"
    #include "cuda_sim/mma_layout.h"

    using namespace paged_attn;

    // 16-bit element codecs, round to nearest even
    struct Bf16 {
      static constexpr const char* name = "bf16";
      static uint16_t from(float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        if (std::isnan(f)) return 0x7fc0;
        u += 0x7fffu + ((u >> 16) & 1u);
        return static_cast<uint16_t>(u >> 16);
      }
      static float to(uint16_t h) { return mma_layout::decode_bf16(h); }
    };
    struct F16 {
      static constexpr const char* name = "fp16";
      static uint16_t from(float f) {
        const _Float16 h = static_cast<_Float16>(f);
        uint16_t u;
        std::memcpy(&u, &h, 2);
        return u;
      }
      static float to(uint16_t u) { return mma_layout::decode_f16(u); }
    };

    // What the 32 lanes publish for an exchange.
    struct Board {
      std::barrier<> bar{32};
      uint32_t a16[32][4], b16[32][2], a8[32][2], b8[32][1];
      float value[32];
    };

    template <typename Codec>
    struct SimulatedMmaOps {
      Board* board;
      int lane;

      uint32_t pack(float l, float h) const {
        return Codec::from(l) | (static_cast<uint32_t>(Codec::from(h)) << 16);
      }
      float exchange(float v, int src) const {
        board->value[lane] = v;
        board->bar.arrive_and_wait();
        const float other = board->value[src];
        board->bar.arrive_and_wait();
        return other;
      }
      float shfl_xor(float v, int mask) const { return exchange(v, lane ^ mask); }
      float shfl(float v, int src) const { return exchange(v, src); }
      float exp(float x) const { return std::exp(x); }

      // every lane publishes its fragments; each computes its own C by the documented layouts
      void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) const {
        std::memcpy(board->a16[lane], a, 16);
        std::memcpy(board->b16[lane], b, 8);
        board->bar.arrive_and_wait();
        mma_layout::mma<16>(board->a16, board->b16, lane, c, Codec::to);
        board->bar.arrive_and_wait();
      }
      void mma1688(float c[4], const uint32_t a[2], uint32_t b) const {
        std::memcpy(board->a8[lane], a, 8);
        board->b8[lane][0] = b;
        board->bar.arrive_and_wait();
        mma_layout::mma<8>(board->a8, board->b8, lane, c, Codec::to);
        board->bar.arrive_and_wait();
      }
    };

    int failures = 0;
    #define CHECK(cond, ...)                      \
      do {                                        \
        if (!(cond)) {                            \
          if (failures < 20) {                    \
            std::printf("FAIL: " __VA_ARGS__);    \
            std::printf("\n");                    \
          }                                       \
          ++failures;                             \
        }                                         \
      } while (0)

    // One case: nh heads of one KV head, head_size dims, tiles of kTile tokens, num_tokens
    // tokens (the last tile partly past the end), QK in kChains chains (GqaMmaWarp::tile).
    template <typename Codec, int kMaxDims, int kTile, int kChains = 2>
    void run_case(int head_size, int nh, int num_tokens, unsigned seed) {
      std::mt19937 rng(seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const int num_tiles = (num_tokens + kTile - 1) / kTile;
      const int tokens = num_tiles * kTile;
      const float scale = 3.0f / std::sqrt(static_cast<float>(head_size));  // sharp softmax
      const uint16_t nan_bits = Codec::from(NAN);
      // the shared-memory images the kernel would hold: K rows [token][kKRow] (an odd number of
      // 16-byte units, as the kernel pads), V rows [dim][token] per tile; past the head size K
      // holds zeros up to kMaxDims (tile()'s precondition: the kernel clears them) and NaN
      // beyond, V NaN
      constexpr int kKRow = ((kMaxDims * 2 / 16) | 1) * 8;  // in 16-bit elements
      std::vector<uint16_t> k(tokens * kKRow, nan_bits), v(num_tiles * kMaxDims * kTile, nan_bits);
      for (int tok = 0; tok < tokens; ++tok)
        for (int d = head_size; d < kMaxDims; ++d) k[tok * kKRow + d] = Codec::from(0.0f);
      std::vector<float> q(kMmaHeads * kMaxDims, 0.0f);
      std::vector<uint32_t> attends(tokens, 0u);  // head bits per token
      for (int h = 0; h < nh; ++h)
        for (int d = 0; d < head_size; ++d) q[h * kMaxDims + d] = Codec::to(Codec::from(normal(rng)));
      for (int tok = 0; tok < tokens; ++tok) {
        const int tile = tok / kTile, in_tile = tok % kTile;
        if (tok < num_tokens && tok % 7 != 3) {  // token 3 of every 7 is attended by nobody
          for (int h = 0; h < nh; ++h)
            if (h != nh - 1 || nh == 1 || (rng() % 4 != 0)) attends[tok] |= 1u << h;
          if (nh > 2) attends[tok] &= ~(1u << 1);  // head 1 attends nothing (when nh > 2)
        }
        for (int d = 0; d < head_size; ++d) {
          const bool read = attends[tok] != 0;  // the kernel zero-fills what it does not read
          k[tok * kKRow + d] = read ? Codec::from(normal(rng)) : Codec::from(0.0f);
          v[(tile * kMaxDims + d) * kTile + in_tile] = read ? Codec::from(normal(rng)) : Codec::from(0.0f);
        }
      }

      // run the warp
      Board board;
      std::vector<float> out(kMmaHeads * kMaxDims, NAN);
      std::vector<int> owners(kMmaHeads * kMaxDims, 0);
      std::vector<SoftmaxStats> stats(kMmaHeads);
      std::vector<std::thread> lanes;
      for (int lane = 0; lane < 32; ++lane) {
        lanes.emplace_back([&, lane] {
          const SimulatedMmaOps<Codec> ops{&board, lane};
          GqaMmaWarp<kMaxDims, kTile, SimulatedMmaOps<Codec>> w;
          w.init(lane);
          w.load_query(ops, [&](int h, int d) { return d < head_size ? q[h * kMaxDims + d] : 0.0f; });
          for (int tile = 0; tile < num_tiles; ++tile) {
            auto k_pair = [&](int tok, int d) {
              const uint16_t* row = &k[(tile * kTile + tok) * kKRow];
              return row[d] | (static_cast<uint32_t>(row[d + 1]) << 16);
            };
            auto v_pair = [&](int d, int tok) {
              const uint16_t* row = &v[(tile * kMaxDims + d) * kTile];
              return row[tok] | (static_cast<uint32_t>(row[tok + 1]) << 16);
            };
            auto logit = [&](int h, int tok, float dot) {
              if (h != w.g) std::abort();  // the header promises the lane's own head
              const int token = tile * kTile + tok;
              return (attends[token] >> h) & 1u ? dot * scale : -INFINITY;
            };
            const FragmentsFromPairs<decltype(k_pair), decltype(v_pair)> frags{w.g, w.t, k_pair, v_pair};
            w.template tile<kChains>(ops, head_size,
                   [&](int b, int s, uint32_t kb[4]) { frags.k_frags(b, s, kb); },
                   [&](int b, int s, uint32_t va[4]) { frags.v_frags(b, s, va); }, logit);
          }
          const SoftmaxStats s = w.head_stats(ops);
          if (lane % 4 == 0) stats[w.g] = s;
          for (int sl = 0; sl < kMaxDims / 16; ++sl) {
            if (16 * sl >= head_size) break;
            for (int i = 0; i < 4; ++i) {
              const int h = w.out_head(i), d = w.out_dim(sl, i);
              out[h * kMaxDims + d] = w.acc[sl][i];
              __atomic_add_fetch(&owners[h * kMaxDims + d], 1, __ATOMIC_RELAXED);
            }
          }
        });
      }
      for (auto& th : lanes) th.join();

      // float64 attention on the same 16-bit inputs
      const float tol = std::strcmp(Codec::name, "bf16") == 0 ? 2.5e-2f : 4e-3f;
      for (int h = 0; h < kMmaHeads; ++h) {
        const int slices = (head_size + 15) / 16 * 16;
        for (int d = 0; d < kMaxDims; ++d)
          CHECK(owners[h * kMaxDims + d] == (d < slices ? 1 : 0), "%s D=%d head %d dim %d held by %d lanes",
                Codec::name, head_size, h, d, owners[h * kMaxDims + d]);
        std::vector<double> logits;
        std::vector<int> which;
        for (int tok = 0; tok < tokens; ++tok) {
          if (h >= nh || !((attends[tok] >> h) & 1u)) continue;
          double dot = 0.0;
          for (int d = 0; d < head_size; ++d)
            dot += static_cast<double>(q[h * kMaxDims + d]) * Codec::to(k[tok * kKRow + d]);
          logits.push_back(dot * scale);
          which.push_back(tok);
        }
        if (logits.empty()) {
          CHECK(stats[h].max == -INFINITY && stats[h].sum == 0.0f, "%s head %d attends nothing: max %g sum %g",
                Codec::name, h, stats[h].max, stats[h].sum);
          for (int d = 0; d < head_size; ++d)
            CHECK(out[h * kMaxDims + d] == 0.0f, "%s head %d attends nothing: out[%d] = %g", Codec::name, h, d,
                  out[h * kMaxDims + d]);
          continue;
        }
        double m = -INFINITY, sum = 0.0;
        for (double l : logits) m = std::fmax(m, l);
        for (double l : logits) sum += std::exp(l - m);
        CHECK(std::fabs(stats[h].max - m) <= 1e-4 * (1.0 + std::fabs(m)), "%s head %d max %g want %g",
              Codec::name, h, stats[h].max, m);
        const double kernel_sum = stats[h].sum * std::exp(static_cast<double>(stats[h].max) - m);
        CHECK(std::fabs(kernel_sum - sum) <= 1e-4 * sum, "%s head %d sum %g want %g", Codec::name, h, kernel_sum, sum);
        for (int d = 0; d < head_size; ++d) {
          double o = 0.0;
          for (size_t i = 0; i < logits.size(); ++i) {
            const int tok = which[i], tile = tok / kTile, in_tile = tok % kTile;
            o += std::exp(logits[i] - m) * Codec::to(v[(tile * kMaxDims + d) * kTile + in_tile]);
          }
          o /= sum;
          const double got = out[h * kMaxDims + d] / stats[h].sum;
          CHECK(std::fabs(got - o) <= tol, "%s D=%d heads=%d head %d dim %d: %g want %g", Codec::name, head_size, nh,
                h, d, got, o);
        }
      }
      std::printf("checked %s D=%d maxD=%d tile=%d heads=%d chains=%d tokens=%d\n", Codec::name, head_size,
                  kMaxDims, kTile, nh, kChains, num_tokens);
    }

    int main() {
      run_case<Bf16, 128, 8>(128, 8, 61, 1);
      run_case<F16, 128, 8>(120, 5, 40, 2);
      run_case<Bf16, 96, 8>(80, 4, 33, 3);
      run_case<F16, 64, 16>(64, 8, 77, 4);
      run_case<Bf16, 256, 8>(256, 6, 20, 5);
      run_case<F16, 32, 32>(32, 3, 100, 6);
      run_case<Bf16, 128, 16>(112, 1, 50, 7);
      run_case<Bf16, 256, 16, 1>(256, 8, 45, 8);  // one QK chain: the kernel's fp8 caches
      run_case<F16, 96, 16, 1>(80, 5, 29, 9);
      if (failures != 0) {
        std::printf("%d failures\n", failures);
        return 1;
      }
      std::printf("OK\n");
      return 0;
    }
""")

CASES = ("bf16 D=128 maxD=128 tile=8 heads=8", "fp16 D=120 maxD=128 tile=8 heads=5",
         "bf16 D=80 maxD=96 tile=8 heads=4", "fp16 D=64 maxD=64 tile=16 heads=8",
         "bf16 D=256 maxD=256 tile=8 heads=6", "fp16 D=32 maxD=32 tile=32 heads=3",
         "bf16 D=112 maxD=128 tile=16 heads=1", "bf16 D=256 maxD=256 tile=16 heads=8 chains=1",
         "fp16 D=80 maxD=96 tile=16 heads=5 chains=1")


def test_gqa_mma_matches_float64_attention(tmp_path):
    exe = host_cpp.build(tmp_path, "gqa_mma_host", HOST_PROGRAM, includes=(host_cpp.TESTS,))
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
    for case in CASES:
        assert f"checked {case} " in run.stdout, case
