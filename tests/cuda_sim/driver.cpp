// driver.cpp — runs the CUDA attention kernels (csrc/cuda: baseline, pipelined, and the pipelined
// kernel on tensor cores) in the host simulation (cuda_sim.h) on the case files
// tests/test_cpu_kernel_cross.py writes, as ops_cuda.cpp launches them: v2 (phase 1 over
// 512-token partitions, then the reduce kernel), v1 / decode in one pass, and the v1 / decode
// split of core/split_plan.h (phase 1 into scratch, then the reduce). Outputs and scratch start
// as NaN; the result is compared with the case's expected output (the oracle's) and tolerances.
//
// Usage: driver CASE_DIR KERNEL...     (KERNEL: baseline, pipelined, mma)
// Env:   CUDA_SIM_FAR_BLOCKS=1  moves every case's cache blocks past element 2^31 of a (mostly
//        untouched, never-committed) larger cache and shifts the block tables to match: the
//        same answer, through 64-bit cache offsets.
// Prints one line per (case, kernel, mode) and exits 1 if any failed, 2 on bad usage, 3 on a
// simulation error (deadlock, __trap). Only the shapes listed in kSimDims / kSimTiles below are
// compiled (the host compiler instantiates each kernel); a case outside them is an error.
#include "cuda_sim.h"  // first: the CUDA keywords the kernels use

#include <sys/mman.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/split_plan.h"
#include "cross/case_file.h"
#include "cuda/attention_kernel.cuh"
#include "cuda/attention_kernel_pipelined.cuh"
#include "cuda/dispatch.cuh"
#include "cuda/reduce_kernel.cuh"

using namespace paged_attn;
using namespace paged_attn::cuda;
using case_file::Case;
using case_file::die;

namespace {

// The shapes compiled here (each is a kernel instantiation per family and dtype pair): dims per
// lane 2-4 (head sizes 64 .. 128, with 80 / 120 leaving part of a 16-dim slice or of a lane's
// dims empty), head tiles 1, 4 and 8; with PAGED_ATTN_SIM_ALL_SHAPES every shape the build
// compiles (a longer compile).
constexpr bool simulated(int dims, int tile) {
#if defined(PAGED_ATTN_SIM_ALL_SHAPES)
  return dims > 0 && tile > 0;
#else
  return dims >= 2 && dims <= 4 && (tile == 1 || tile == 4 || tile == 8);
#endif
}
constexpr int kSimSms = 4;  // the "GPU" the split plan sizes for: few SMs, so rows get split

// Phase 1 (or the one pass) with the chosen kernel: "" when it ran, "tensor cores" when the mma
// choice ran the tensor-core kernel, "error: ..." when the shape is not simulated.
template <ScalarKind kScalar, CacheKind kCache>
std::string launch_attention(const std::string& kernel, const PagedAttentionParams& p) {
  using Scalar = typename ScalarOf<kScalar>::type;
  using CacheT = typename CacheElement<Scalar, kCache>::type;
  const dim3 grid(p.num_seqs, p.num_kv_heads, p.partition_size > 0 ? p.max_num_partitions : 1);
  std::string ran = "error: shape not simulated";
  dispatch_head_size(p.head_size, [&](auto dims_c) {
    dispatch_head_tile(p.num_heads / p.num_kv_heads, [&](auto tile_c) {
      constexpr int kDims = decltype(dims_c)::value, kTile = decltype(tile_c)::value;
      if constexpr (simulated(kDims, kTile)) {
        ran = "";
        if (kernel == "baseline") {
          cuda_sim::launch(grid, kThreads, 0, [&] {
            paged_attention_kernel<Scalar, kCache, kDims, kTile, kWarpSize, kNumWarps>(p);
          });
          return;
        }
        auto pipelined = [&](auto mma_c) {
          constexpr bool kMma = decltype(mma_c)::value;
          using Cfg = PipelineConfig<CacheT, kDims, kTile, kWarpSize, kNumWarps, kMma>;
          cuda_sim::launch(grid, kThreads, Cfg::kSmemBytes, [&] {
            paged_attention_pipelined_kernel<Scalar, kCache, kDims, kTile, kWarpSize, kNumWarps,
                                             kMma>(p);
          });
        };
        if (kernel == "mma" && uses_tensor_cores(kScalar, kTile)) {
          pipelined(std::integral_constant<bool, uses_tensor_cores(kScalar, kTile)>{});
          ran = "tensor cores";
        } else {
          pipelined(std::false_type{});
        }
      }
    });
  });
  return ran;
}

template <ScalarKind kScalar, CacheKind kCache>
std::string run_mode(const std::string& kernel, const std::string& mode, Case& c) {
  using Scalar = typename ScalarOf<kScalar>::type;
  PagedAttentionParams p = c.p;
  const int64_t S = p.num_seqs, H = p.num_heads, D = p.head_size;
  std::vector<Scalar> query(c.query.size()), out(S * H * D, from_float<Scalar>(NAN));
  for (size_t i = 0; i < query.size(); ++i) query[i] = from_float<Scalar>(c.query[i]);
  p.query = query.data();
  p.out = out.data();
  p.partition_size = 0;
  p.max_num_partitions = 1;
  if (mode == "v2") {
    p.partition_size = kPartitionSize;
    p.max_num_partitions = std::max(1, (p.max_seq_len + kPartitionSize - 1) / kPartitionSize);
  } else if (mode == "split") {
    const SplitPlan plan = plan_split({S, p.num_kv_heads,
                                       static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size,
                                       kSimSms, kThreads});
    if (!plan.split()) return "skip: the plan does not split this shape";
    p.partition_size = plan.partition_size;
    p.max_num_partitions = plan.num_partitions;
  }
  const int64_t P = p.max_num_partitions;
  std::vector<float> exp_sums(S * H * P, NAN), max_logits(S * H * P, NAN);
  std::vector<Scalar> tmp_out(S * H * P * D, from_float<Scalar>(NAN));
  p.exp_sums = exp_sums.data();
  p.max_logits = max_logits.data();
  p.tmp_out = tmp_out.data();
  const std::string launched = launch_attention<kScalar, kCache>(kernel, p);
  if (launched.rfind("error", 0) == 0) return launched;
  if (p.partition_size > 0)
    cuda_sim::launch(dim3(S, H, 1), kThreads, 0, [&] {
      paged_attention_v2_reduce_kernel<Scalar, kWarpSize, kNumWarps, kMaxHeadSize>(p);
    });
  int64_t bad = 0, worst = -1;
  double worst_excess = -1;
  for (int64_t i = 0; i < S * H * D; ++i) {
    const double got = to_float(out[i]), want = c.want[i];
    if (got == want || (std::isnan(got) && std::isnan(want))) continue;  // inf / NaN wanted
    const double err = std::fabs(got - want), tol = c.atol + c.rtol * std::fabs(want);
    if (err <= tol) continue;  // false for NaN
    ++bad;
    const double excess = std::isnan(err) ? INFINITY : err - tol;
    if (excess > worst_excess) worst_excess = excess, worst = i;
  }
  if (bad == 0) return launched.empty() ? "" : "ok: " + launched;
  char msg[256];
  std::snprintf(msg, sizeof msg, "%lld of %lld elements off; worst [seq %lld, head %lld, dim %lld]"
                " got %.7g want %.7g", (long long)bad, (long long)(S * H * D),
                (long long)(worst / D / H), (long long)(worst / D % H), (long long)(worst % D),
                double(to_float(out[worst])), double(c.want[worst]));
  return msg;
}

std::string run(const std::string& kernel, const std::string& mode, Case& c) {
#define PA_SIM_PAIR(S, C)                                                    \
  if (c.p.scalar_kind == ScalarKind::S && c.p.cache_kind == CacheKind::C) \
    return run_mode<ScalarKind::S, CacheKind::C>(kernel, mode, c);
  PAGED_ATTN_CUDA_PAIRS(PA_SIM_PAIR)
#undef PA_SIM_PAIR
  return "error: no such (dtype, cache) pair";
}

// CUDA_SIM_FAR_BLOCKS: the case's K and V storage copied to the end of fresh caches of
// `far` + num_blocks blocks, far chosen so that block `far` starts past element 2^31 of both,
// and every in-range table entry shifted by far. The new caches are anonymous mappings that
// reserve no memory: only the pages the copies write (and the kernels read) are ever touched.
void move_blocks_far(Case& c) {
  PagedAttentionParams& p = c.p;
  const int64_t elem = cache_element_bytes(p.scalar_kind, p.cache_kind);
  const int64_t min_stride = std::min(p.k_layout.block_stride, p.v_layout.block_stride);
  const int64_t far = (int64_t{1} << 31) / min_stride + 1;
  if (far + p.num_blocks > INT32_MAX) die(c.name + ": blocks too small to move past 2^31");
  auto move = [&](const std::vector<unsigned char>& bytes, int64_t block_stride) {
    const size_t offset = static_cast<size_t>(far * block_stride * elem);
    void* base = mmap(nullptr, offset + bytes.size(), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) die(c.name + ": mmap of the far cache failed");
    std::memcpy(static_cast<unsigned char*>(base) + offset, bytes.data(), bytes.size());
    return static_cast<const void*>(base);  // never unmapped: the driver exits soon
  };
  p.key_cache = move(c.k, p.k_layout.block_stride);
  p.value_cache = move(c.v, p.v_layout.block_stride);
  for (int32_t& id : c.tables)
    if (id >= 0 && id < p.num_blocks) id += static_cast<int32_t>(far);
  p.num_blocks += far;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) die("usage: driver CASE_DIR KERNEL...");
  const std::vector<std::string> paths = case_file::case_paths(argv[1]);
  const char* far = std::getenv("CUDA_SIM_FAR_BLOCKS");
  const bool move_far = far != nullptr && far[0] == '1';
  int failed = 0, passed = 0;
  for (const auto& path : paths) {
    Case c = case_file::read_case(path);
    if (move_far) move_blocks_far(c);
    for (int k = 2; k < argc; ++k) {
      const std::string kernel = argv[k];
      if (kernel != "baseline" && kernel != "pipelined" && kernel != "mma")
        die("unknown kernel " + kernel);
      for (const char* mode : {"v2", "v1", "split"}) {
        const std::string why = run(kernel, mode, c);
        if (why.rfind("skip", 0) == 0) {
          std::printf("SKIP %s [%s %s]: %s\n", c.name.c_str(), kernel.c_str(), mode, why.c_str());
        } else if (why.empty() || why.rfind("ok: ", 0) == 0) {
          ++passed;
          std::printf("ok   %s [%s %s]%s\n", c.name.c_str(), kernel.c_str(), mode,
                      why.empty() ? "" : (" (" + why.substr(4) + ")").c_str());
        } else {
          ++failed;
          std::printf("FAIL %s [%s %s]: %s\n", c.name.c_str(), kernel.c_str(), mode, why.c_str());
        }
        std::fflush(stdout);
      }
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
