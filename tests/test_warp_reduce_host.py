"""The warp butterfly of csrc/cuda/warp_reduce.cuh, run on the host with simulated lanes.

The CUDA kernels combine softmax compound states (max, sum, output) across lanes with
`butterfly_allreduce`, whose lane exchange is an injected policy. Here a small C++ program runs
that same header with a policy that simulates lanes as threads meeting at a barrier (each
exchange: every lane publishes its value, waits, reads lane ^ mask's), for warp widths 32 and 64,
whole warps and sub-groups, with empty lanes (max = -inf), random states, and all-empty warps. It
checks every lane's result against (a) a sequential merge_stats fold and (b) the softmax
statistics computed directly in double precision from the logits each lane summarised.
"""

import subprocess
import textwrap

from support import host_cpp

HOST_PROGRAM = textwrap.dedent(r"""
    #include <barrier>
    #include <cmath>
    #include <cstdio>
    #include <cstdlib>
    #include <functional>
    #include <random>
    #include <thread>
    #include <vector>

    #include "cuda/warp_reduce.cuh"

    using namespace paged_attn;

    // Lanes simulated as threads: an exchange is publish, barrier, read lane ^ mask, barrier.
    template <typename T>
    struct Exchange {
      explicit Exchange(int lanes) : slots(lanes), bar(lanes) {}
      std::vector<T> slots;
      std::barrier<> bar;
    };

    template <typename T>
    struct SimulatedShuffle {
      Exchange<T>* ex;
      int lane;
      T operator()(const T& mine, int lane_mask) const {
        ex->slots[lane] = mine;
        ex->bar.arrive_and_wait();
        T other = ex->slots[lane ^ lane_mask];
        ex->bar.arrive_and_wait();
        return other;
      }
    };

    // Runs butterfly_allreduce<W, L> in W simulated lanes; returns every lane's result.
    template <int W, int L, typename T, typename Op>
    std::vector<T> run_warp(const std::vector<T>& in, Op op) {
      Exchange<T> ex(W);
      std::vector<T> out(W);
      std::vector<std::thread> lanes;
      for (int lane = 0; lane < W; ++lane) {
        lanes.emplace_back([&, lane] {
          SimulatedShuffle<T> shuffle{&ex, lane};
          out[lane] = butterfly_allreduce<W, L>(in[lane], op, shuffle);
        });
      }
      for (auto& t : lanes) t.join();
      return out;
    }

    constexpr int N = 3;  // output elements per compound state
    int failures = 0;

    void expect(bool ok, const char* what, int w, int l, int trial, int lane, double got,
                double want) {
      if (!ok && failures++ < 20)
        std::printf("FAIL %s W=%d L=%d trial=%d lane=%d got=%.9g want=%.9g\n", what, w, l, trial,
                    lane, got, want);
    }

    bool close(double got, double want, double tol) {
      if (std::isinf(want) || std::isinf(got)) return got == want;
      return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
    }

    template <int W, int L>
    void check(std::mt19937& rng, int trials) {
      std::normal_distribution<double> normal(0.0, 3.0);
      std::uniform_int_distribution<int> count(0, 4);
      std::uniform_real_distribution<double> unit(0.0, 1.0);
      for (int trial = 0; trial < trials; ++trial) {
        // empty-lane probability: 0 (none), some, 1 (all empty), varied by trial
        const double p_empty = trial % 5 == 0 ? 1.0 : (trial % 5 == 1 ? 0.0 : unit(rng));
        std::vector<CompoundState<N>> states(W);
        std::vector<SoftmaxStats> stats(W);
        std::vector<float> values(W);
        // per lane: the logits and value vectors it summarises (for the double reference)
        std::vector<std::vector<double>> lane_logits(W);
        std::vector<std::vector<std::array<double, N>>> lane_vals(W);
        for (int lane = 0; lane < W; ++lane) {
          CompoundState<N>& s = states[lane];
          s.init();
          const int n = unit(rng) < p_empty ? 0 : 1 + count(rng);
          for (int k = 0; k < n; ++k) {
            const float logit = static_cast<float>(normal(rng));
            std::array<double, N> v;
            CompoundState<N> one;
            one.stats = SoftmaxStats{logit, 1.0f};
            for (int i = 0; i < N; ++i) {
              v[i] = static_cast<float>(normal(rng));
              one.out[i] = static_cast<float>(v[i]);
            }
            s.merge(one);
            lane_logits[lane].push_back(logit);
            lane_vals[lane].push_back(v);
          }
          stats[lane] = s.stats;
          values[lane] = static_cast<float>(normal(rng));
        }

        auto got_c = run_warp<W, L>(states, CompoundMergeOp<N>{});
        auto got_s = run_warp<W, L>(stats, StatsMergeOp{});
        auto got_max = run_warp<W, L>(values, MaxOp{});
        auto got_sum = run_warp<W, L>(values, SumOp{});

        for (int g0 = 0; g0 < W; g0 += L) {  // each aligned group of L lanes
          // (a) sequential merge in lane order
          CompoundState<N> seq;
          seq.init();
          float vmax = -INFINITY, vsum = 0.0f;
          // (b) direct double-precision softmax statistics of all the group's logits
          double m = -INFINITY;
          for (int lane = g0; lane < g0 + L; ++lane) {
            seq.merge(states[lane]);
            vmax = std::fmax(vmax, values[lane]);
            vsum += values[lane];
            for (double l : lane_logits[lane]) m = std::fmax(m, l);
          }
          double sum = 0.0, out[N] = {0.0};
          if (m != -INFINITY) {
            for (int lane = g0; lane < g0 + L; ++lane)
              for (size_t k = 0; k < lane_logits[lane].size(); ++k) {
                const double e = std::exp(lane_logits[lane][k] - m);
                sum += e;
                for (int i = 0; i < N; ++i) out[i] += e * lane_vals[lane][k][i];
              }
          }
          for (int lane = g0; lane < g0 + L; ++lane) {
            const CompoundState<N>& c = got_c[lane];
            const SoftmaxStats& s = got_s[lane];
            expect(!std::isnan(c.stats.max) && !std::isnan(c.stats.sum), "no NaN", W, L, trial,
                   lane, c.stats.sum, sum);
            expect(c.stats.max == seq.stats.max, "max vs sequential", W, L, trial, lane,
                   c.stats.max, seq.stats.max);
            expect(c.stats.max == static_cast<float>(m), "max vs direct", W, L, trial, lane,
                   c.stats.max, m);
            expect(close(c.stats.sum, seq.stats.sum, 1e-5), "sum vs sequential", W, L, trial,
                   lane, c.stats.sum, seq.stats.sum);
            expect(close(c.stats.sum, sum, 1e-5), "sum vs direct", W, L, trial, lane,
                   c.stats.sum, sum);
            for (int i = 0; i < N; ++i) {
              expect(!std::isnan(c.out[i]), "out no NaN", W, L, trial, lane, c.out[i], out[i]);
              expect(close(c.out[i], seq.out[i], 1e-5), "out vs sequential", W, L, trial, lane,
                     c.out[i], seq.out[i]);
              expect(close(c.out[i], out[i], 1e-5), "out vs direct", W, L, trial, lane, c.out[i],
                     out[i]);
            }
            expect(s.max == c.stats.max && close(s.sum, sum, 1e-5), "stats-only merge", W, L,
                   trial, lane, s.sum, sum);
            if (m == -INFINITY)
              expect(c.stats.sum == 0.0f && s.sum == 0.0f && c.out[0] == 0.0f,
                     "all-empty stays empty", W, L, trial, lane, c.stats.sum, 0.0);
            expect(got_max[lane] == vmax, "MaxOp", W, L, trial, lane, got_max[lane], vmax);
            expect(got_max[lane] == got_max[g0], "MaxOp same bits in all lanes", W, L, trial,
                   lane, got_max[lane], got_max[g0]);
            expect(close(got_sum[lane], vsum, 1e-5), "SumOp", W, L, trial, lane, got_sum[lane],
                   vsum);
          }
        }
      }
      std::printf("checked W=%d L=%d trials=%d\n", W, L, trials);
    }

    int main() {
      std::mt19937 rng(12345);
      check<32, 32>(rng, 40);
      check<64, 64>(rng, 40);
      check<32, 8>(rng, 10);
      check<64, 16>(rng, 10);
      if (failures) {
        std::printf("%d failures\n", failures);
        return 1;
      }
      std::printf("OK\n");
      return 0;
    }
""")


def test_butterfly_matches_sequential_merge(tmp_path):
    exe = host_cpp.build(tmp_path, "warp_reduce_host", HOST_PROGRAM)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "OK" in run.stdout, run.stdout + run.stderr
    for width, lanes in ((32, 32), (64, 64), (32, 8), (64, 16)):
        assert f"checked W={width} L={lanes}" in run.stdout
