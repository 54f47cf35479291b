// kernel_bench.cpp: the CPU kernel alone, without torch or the launcher's merge: one variant's
// work items (csrc/cpu/work_items.h) on random K / V in shuffled blocks, split over threads in
// contiguous runs of items as at::parallel_for does, K / V warm or read from memory. With --read,
// the same threads read the same cache lines in the same order and compute nothing: what the
// memory gives that access pattern, the kernel's ceiling when K / V come from DRAM.
//
//   g++ -O3 -std=c++17 -pthread -I csrc csrc/cpu/isa_*.cpp csrc/cpu/kernel_variants.cpp \
//       csrc/cpu/work_items.cpp scripts/bench/kernel_bench.cpp -o /tmp/kernel_bench
//   /tmp/kernel_bench --layout hnd --variant amx --threads 2 --cold            # Llama 8 x 4k bf16
//   /tmp/kernel_bench --layout hnd --threads 2 --cold --read
//   /tmp/kernel_bench --seqs 1 --ctx 256 --threads 1                           # in L2
//
// Options (defaults): --layout vllm|nhd|hnd (vllm)  --variant NAME (the first this CPU runs)
// --dtype bfloat16|float32 (bfloat16)  --seqs 8 --ctx 4096 --heads 32 --kv-heads 8 --head 128
// --block 16  --threads 1  --cold (read --flush-mib 1024 MiB before each call)  --reps 11
// Prints the median and fastest call in ms, ns per token per KV head (wall) and GB/s of K + V.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/kv_layout.h"
#include "cpu/attention_kernel.h"
#include "cpu/kernel_common.h"
#include "cpu/work_items.h"

using namespace paged_attn;
using namespace paged_attn::cpu;

namespace {

struct Options {
  std::string layout = "vllm", variant, dtype = "bfloat16";
  int seqs = 8, ctx = 4096, heads = 32, kv_heads = 8, head = 128, block = 16, threads = 1;
  int reps = 11, flush_mib = 1024;
  bool cold = false, read = false;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "kernel_bench: %s (the header of scripts/bench/kernel_bench.cpp lists the options)\n", why);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("no value after " + a).c_str());
      return argv[++i];
    };
    const auto number = [&]() {  // a whole decimal number, else usage()
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || n < 0 || n > (1L << 30)) usage((a + ": not a count: " + v).c_str());
      return static_cast<int>(n);
    };
    if (a == "--layout") o.layout = value();
    else if (a == "--variant") o.variant = value();
    else if (a == "--dtype") o.dtype = value();
    else if (a == "--seqs") o.seqs = number();
    else if (a == "--ctx") o.ctx = number();
    else if (a == "--heads") o.heads = number();
    else if (a == "--kv-heads") o.kv_heads = number();
    else if (a == "--head") o.head = number();
    else if (a == "--block") o.block = number();
    else if (a == "--threads") o.threads = number();
    else if (a == "--reps") o.reps = number();
    else if (a == "--flush-mib") o.flush_mib = number();
    else if (a == "--cold") o.cold = true;
    else if (a == "--read") o.read = true;
    else usage(("unknown option " + a).c_str());
  }
  if (o.layout != "vllm" && o.layout != "nhd" && o.layout != "hnd") usage("--layout: vllm, nhd or hnd");
  if (o.dtype != "bfloat16" && o.dtype != "float32") usage("--dtype: bfloat16 or float32");
  if (std::min({o.seqs, o.ctx, o.heads, o.kv_heads, o.head, o.block, o.threads, o.reps}) < 1 ||
      o.heads % o.kv_heads != 0)
    usage("sizes must be at least 1, --heads a multiple of --kv-heads");
  if (o.layout == "vllm" && o.head % (o.dtype == "bfloat16" ? 8 : 4) != 0)
    usage("vLLM's K layout: --head a multiple of 16 bytes");
  return o;
}

// Page-aligned, as torch's CPU allocator aligns tensors (a tile row straddling two cache lines
// is much slower to load: docs/CPU_KERNEL.md).
struct Buffer {
  explicit Buffer(size_t bytes) : size(bytes), data(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {}
  ~Buffer() { std::free(data); }
  size_t size;
  char* data;
};

// The top half of a float's bits: its bf16 value, rounded toward zero.
uint16_t bf16_top(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return static_cast<uint16_t>(bits >> 16);
}

// A random value of N(0, 1) as the cache element.
void fill(Buffer& b, bool bf16, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < b.size / (bf16 ? 2 : 4); ++i) {
    const float x = normal(rng);
    if (bf16) {
      const uint16_t top = bf16_top(x);
      std::memcpy(b.data + 2 * i, &top, 2);
    } else {
      std::memcpy(b.data + 4 * i, &x, 4);
    }
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  const bool bf16 = o.dtype == "bfloat16";
  const int esize = bf16 ? 2 : 4, D = o.head, bs = o.block;
  const int blocks_per_seq = (o.ctx + bs - 1) / bs;
  const int64_t num_blocks = int64_t{o.seqs} * blocks_per_seq;
  const int64_t block_elems = int64_t{o.kv_heads} * bs * D;

  std::mt19937 rng(1);
  Buffer K(num_blocks * block_elems * esize), V(num_blocks * block_elems * esize);
  fill(K, bf16, rng);
  fill(V, bf16, rng);
  std::vector<float> query(int64_t{o.seqs} * o.heads * D);
  for (float& x : query) {  // bf16-exact, as the launcher's copy of a bf16 query
    x = std::normal_distribution<float>()(rng);
    if (bf16) {
      const uint32_t bits = uint32_t{bf16_top(x)} << 16;
      std::memcpy(&x, &bits, 4);
    }
  }
  std::vector<int32_t> tables(num_blocks), lens(o.seqs, o.ctx);
  for (int64_t i = 0; i < num_blocks; ++i) tables[i] = static_cast<int32_t>(i);
  std::shuffle(tables.begin(), tables.end(), rng);

  PagedAttentionParams p{};
  p.scalar_kind = bf16 ? ScalarKind::kBFloat16 : ScalarKind::kFloat32;
  p.cache_kind = CacheKind::kAuto;
  p.num_seqs = o.seqs, p.num_heads = o.heads, p.num_kv_heads = o.kv_heads, p.head_size = D;
  p.block_size = bs, p.max_blocks_per_seq = blocks_per_seq, p.num_blocks = num_blocks;
  if (o.layout == "vllm") {
    p.kv_form = KvForm::kVllm;
    p.k_layout = vllm_key_layout(block_elems, int64_t{bs} * D, bs, vllm_key_x(esize));
    p.v_layout = vllm_value_layout(block_elems, int64_t{bs} * D, bs);
  } else {
    p.kv_form = KvForm::kTokenMajor;
    const bool hnd = o.layout == "hnd";  // [block, head, token, dim] / [block, token, head, dim]
    p.k_layout = token_major_layout(block_elems, hnd ? D : int64_t{o.kv_heads} * D,
                                    hnd ? int64_t{bs} * D : D, D);
    p.v_layout = p.k_layout;
  }
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.k_scale = p.v_scale = 1.0f;
  p.query = query.data(), p.q_seq_stride = int64_t{o.heads} * D, p.q_head_stride = D;
  p.key_cache = K.data, p.value_cache = V.data;
  p.block_tables = tables.data(), p.seq_lens = lens.data(), p.max_seq_len = o.ctx;
  const int P = std::max(1, (o.ctx + kPartitionSize - 1) / kPartitionSize);
  p.max_num_partitions = P;

  int count = 0;
  const KernelVariant* variants = kernel_variants(&count);
  const KernelVariant* var = nullptr;
  for (int i = 0; i < count && var == nullptr; ++i)
    if (o.variant.empty() ? variants[i].cpu_supports() : o.variant == variants[i].name) var = &variants[i];
  if (var == nullptr || !var->cpu_supports()) usage("no such variant, or this CPU does not run it");

  const int heads_per_item = kv_heads_per_item(p, seq_lengths(p), o.threads);
  const std::vector<PartitionTask> tasks = work_items(p, heads_per_item);
  const int64_t rows = int64_t{o.seqs} * o.heads;
  std::vector<float> max_logits(rows * P), exp_sums(rows * P), part_out(rows * P * D);
  std::vector<std::vector<float>> scratch(o.threads, std::vector<float>(kernel_scratch_floats(p, heads_per_item)));
  KernelInputs in;
  in.query = query.data(), in.qk_scale = p.scale, in.v_scale = 1.0f;
  in.max_logits = max_logits.data(), in.exp_sums = exp_sums.data();
  in.part_out = part_out.data(), in.num_partitions = P;

  // Thread t's items: a contiguous run, as at::parallel_for's static split.
  const auto items_of = [&](int t) {
    return std::make_pair(tasks.size() * t / o.threads, tasks.size() * (t + 1) / o.threads);
  };
  std::vector<uint64_t> sums(o.threads);  // --read: what the reads saw, so they are not dropped
  const auto run_thread = [&](int t) {
    const auto [begin, end] = items_of(t);
    if (!o.read) {
      for (size_t i = begin; i < end; ++i)
        var->run(p, in, tasks[i], i + 1 < end ? &tasks[i + 1] : nullptr, scratch[t].data());
      return;
    }
    uint64_t sum = 0;  // one 8-byte word per cache line of each slice's runs (kernel_common.h)
    const SliceBytes k_mem = slice_bytes(p.kv_form, p.k_layout, D, bs, esize);
    const SliceBytes v_mem = slice_bytes(p.kv_form, p.v_layout, D, bs, esize);
    const auto read_slice = [&](const char* base, const SliceBytes& m) {
      for (int64_t r = 0; r < m.runs; ++r)
        for (int64_t l = 0; l < m.run_bytes; l += 64) {
          uint64_t w;
          std::memcpy(&w, base + r * m.run_stride + l, 8);
          sum += w;
        }
    };
    for (size_t i = begin; i < end; ++i) {
      const PartitionTask& task = tasks[i];
      const int t0 = task.partition * kPartitionSize, t1 = std::min(o.ctx, t0 + kPartitionSize);
      for (int b = t0 / bs; b * bs < t1; ++b)
        for (int h = task.kv_head; h < task.kv_head + task.kv_heads; ++h) {
          const int32_t block = tables[int64_t{task.seq} * blocks_per_seq + b];
          read_slice(K.data + p.k_layout.slice(block, h) * esize, k_mem);
          read_slice(V.data + p.v_layout.slice(block, h) * esize, v_mem);
        }
    }
    sums[t] = sum;
  };
  const auto on_threads = [&](const auto& job) {
    std::vector<std::thread> others;
    for (int t = 1; t < o.threads; ++t) others.emplace_back(job, t);
    job(0);
    for (std::thread& th : others) th.join();
  };
  std::vector<char> flush_buffer(o.cold ? static_cast<size_t>(o.flush_mib) << 20 : 0, 1);
  const auto flush_caches = [&] {  // read, not written: dirty lines would be written back later
    on_threads([&](int t) {
      uint64_t s = 0;
      const size_t n = flush_buffer.size(), b = n * t / o.threads, e = n * (t + 1) / o.threads;
      for (size_t i = b; i < e; i += 64) s += static_cast<unsigned char>(flush_buffer[i]);
      sums[t] += s;
    });
  };

  on_threads(run_thread);  // warm-up
  const int calls_per_rep = o.cold ? 1 : std::max(1, static_cast<int>(4e6 / (double(o.seqs) * o.ctx * o.kv_heads)));
  std::vector<double> times;
  for (int r = 0; r < o.reps; ++r) {
    if (o.cold) flush_caches();
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls_per_rep; ++c) on_threads(run_thread);
    times.push_back(seconds_since(t0) / calls_per_rep);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2], fastest = times[0];
  const double tokens = double(o.seqs) * o.ctx * o.kv_heads, kv_bytes = 2.0 * tokens * D * esize;
  static volatile uint64_t seen = 0;  // the reads' sums, kept so that they are not dropped
  for (uint64_t s : sums) seen = seen + s;
  std::printf("%s %s %s, %d x %d tokens, heads %d/%d, head %d, block %d, %d thread(s), %s: "
              "median %.3f ms (fastest %.3f), %.2f ns per token and KV head, %.1f GB/s\n",
              o.read ? "read" : var->name, o.layout.c_str(), o.dtype.c_str(), o.seqs, o.ctx, o.heads,
              o.kv_heads, D, bs, o.threads, o.cold ? "from memory" : "warm", median * 1e3,
              fastest * 1e3, median * 1e9 / tokens, kv_bytes / median / 1e9);
  return 0;
}
