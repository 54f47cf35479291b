// driver.cpp — runs the framework-free CPU kernel variants (csrc/cpu) on case files written by
// tests/support/cross_cases.py, with no torch: it builds PagedAttentionParams / KernelInputs,
// the work items and the partition merge as the launcher does (csrc/cpu/paged_attention_cpu.cpp),
// single-threaded. scripts/ci/cross_test.sh builds it for the host and for aarch64 (qemu-aarch64).
//
// Usage: driver CASE_DIR [VARIANT...]      (no VARIANT: every variant of this build)
// Prints "<variant>: N cases passed, M failed" per variant (or "skipped" when cpu_supports() is
// false) and a line per failing case; exits 1 if any case failed, 2 on bad usage / input.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "case_file.h"
#include "core/compound_state.h"
#include "cpu/attention_kernel.h"
#include "cpu/work_items.h"

using namespace paged_attn;
using namespace paged_attn::cpu;
using case_file::Case;
using case_file::die;
using case_file::read_case;

namespace {

int partitions_of(int seq_len) { return (seq_len + kPartitionSize - 1) / kPartitionSize; }

// Runs one variant on one case as the launcher does; returns "" or what is wrong.
std::string run_case(const KernelVariant& var, Case& c) {
  PagedAttentionParams& p = c.p;
  const int D = p.head_size, P = std::max(1, partitions_of(p.max_seq_len));
  p.max_num_partitions = P;
  // Work items as the launcher builds them for one thread (work_items.h: NHD items of several
  // KV heads where the L2 allows).
  const int heads_per_item = kv_heads_per_item(p, seq_lengths(p), 1);
  const std::vector<PartitionTask> tasks = work_items(p, heads_per_item);
  // Results and scratch pre-filled with NaN (the launcher's are uninitialised / zeroed): a
  // kernel that reads what it did not write shows up as NaN.
  const int64_t rows = int64_t{p.num_seqs} * p.num_heads;
  std::vector<float> max_logits(rows * P, NAN), exp_sums(rows * P, NAN), part_out(rows * P * D, NAN);
  std::vector<float> scratch(kernel_scratch_floats(p, heads_per_item), NAN);
  const bool fp8 = p.cache_kind != CacheKind::kAuto;
  KernelInputs in;
  in.query = c.query.data();
  in.qk_scale = p.scale * (fp8 ? c.k_scale : 1.0f);
  in.v_scale = fp8 ? c.v_scale : 1.0f;
  in.max_logits = max_logits.data(), in.exp_sums = exp_sums.data();
  in.part_out = part_out.data(), in.num_partitions = P;
  for (size_t i = 0; i < tasks.size(); ++i)
    var.run(p, in, tasks[i], i + 1 < tasks.size() ? &tasks[i + 1] : nullptr, scratch.data());

  // Merge (launcher's merge_partitions) and compare. The launcher then rounds out to the query
  // dtype once; we compare the fp32 result (testing.tolerances covers that rounding).
  int64_t bad = 0, worst = -1;
  double worst_excess = -1, worst_got = 0;
  std::vector<float> w(P), acc(D);
  for (int64_t row = 0; row < rows; ++row) {
    const int n = partitions_of(c.lens[row / p.num_heads]);
    const float* part = part_out.data() + row * P * D;
    std::fill(acc.begin(), acc.end(), 0.0f);
    if (n > 0) {
      partition_weights(max_logits.data() + row * P, exp_sums.data() + row * P, n, w.data());
      for (int q = 0; q < n; ++q)
        for (int d = 0; d < D; ++d) acc[d] += w[q] * part[q * D + d];
    }
    for (int d = 0; d < D; ++d) {
      const float got = acc[d], want = c.want[row * D + d];
      if (got == want || (std::isnan(got) && std::isnan(want))) continue;  // inf / NaN wanted
      const double err = std::fabs(double(got) - want), tol = c.atol + c.rtol * std::fabs(want);
      if (err <= tol) continue;  // false for NaN
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - tol;
      if (excess > worst_excess) worst_excess = excess, worst = row * D + d, worst_got = got;
    }
  }
  if (bad == 0) return "";
  char msg[256];
  const int64_t row = worst / D;
  std::snprintf(msg, sizeof msg, "%lld of %lld elements off; worst [seq %lld, head %lld, dim %lld]"
                " got %.7g want %.7g (atol %g rtol %g)", (long long)bad, (long long)(rows * D),
                (long long)(row / p.num_heads), (long long)(row % p.num_heads),
                (long long)(worst % D), worst_got, double(c.want[worst]), c.atol, c.rtol);
  return msg;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: driver CASE_DIR [VARIANT...]");
  const std::vector<std::string> paths = case_file::case_paths(argv[1]);
  std::vector<Case> cases;
  for (const auto& path : paths) cases.push_back(read_case(path));

  int count = 0;
  const KernelVariant* variants = kernel_variants(&count);
  std::vector<const KernelVariant*> chosen;
  for (int a = 2; a < argc; ++a) {
    const KernelVariant* found = nullptr;
    for (int i = 0; i < count; ++i)
      if (std::strcmp(variants[i].name, argv[a]) == 0) found = &variants[i];
    if (!found) die(std::string("no variant '") + argv[a] + "' in this build");
    chosen.push_back(found);
  }
  if (chosen.empty())
    for (int i = 0; i < count; ++i) chosen.push_back(&variants[i]);

#if defined(__aarch64__)
  const char* arch = "aarch64";
#elif defined(__x86_64__)
  const char* arch = "x86-64";
#else
  const char* arch = "other";
#endif
  std::printf("driver (%s build): %zu cases from %s\n", arch, cases.size(), argv[1]);
  int failed_total = 0;
  for (const KernelVariant* var : chosen) {
    if (!var->cpu_supports()) {
      std::printf("%s: skipped (cpu_supports() is false on this CPU)\n", var->name);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    int passed = 0, failed = 0;
    for (Case& c : cases) {
      const std::string why = run_case(*var, c);
      if (why.empty()) {
        ++passed;
      } else {
        ++failed;
        std::printf("  FAIL %s %s: %s\n", var->name, c.name.c_str(), why.c_str());
      }
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s: %d cases passed, %d failed (%.2f s)\n", var->name, passed, failed, sec);
    std::fflush(stdout);
    failed_total += failed;
  }
  return failed_total ? 1 : 0;
}
