// case_file.h — reads the case files tests/support/cross_cases.py writes (its docstring has
// the layout) into PagedAttentionParams over host buffers: shared by the drivers that run our
// kernels without torch (tests/cross/driver.cpp: the CPU variants; tests/cuda_sim/driver.cpp: the
// CUDA kernels in the host simulation).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/kv_layout.h"
#include "core/params.h"

namespace case_file {

using namespace paged_attn;

// One case file (layout: tests/support/cross_cases.py's docstring).
struct Case {
  std::string name;
  PagedAttentionParams p{};
  std::vector<float> query, alibi, want;
  std::vector<unsigned char> k, v;
  std::vector<int32_t> tables, lens;
  float k_scale = 1, v_scale = 1, atol = 0, rtol = 0;
};

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "driver: %s\n", msg.c_str());
  std::exit(2);
}

template <typename T>
inline void read_into(std::ifstream& f, std::vector<T>& v, int64_t n, const std::string& path) {
  v.resize(n);
  if (!f.read(reinterpret_cast<char*>(v.data()), n * sizeof(T))) die(path + ": truncated");
}

inline Case read_case(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  int64_t h[26];
  float fl[5];
  if (!f.read(magic, 8) || std::memcmp(magic, "PACASE3", 8) != 0) die(path + ": bad magic");
  if (!f.read(reinterpret_cast<char*>(h), sizeof h) || !f.read(reinterpret_cast<char*>(fl), sizeof fl))
    die(path + ": truncated header");
  Case c;
  PagedAttentionParams& p = c.p;
  p.scalar_kind = static_cast<ScalarKind>(h[0]);
  p.cache_kind = static_cast<CacheKind>(h[1]);
  p.num_seqs = h[2], p.num_heads = h[3], p.num_kv_heads = h[4], p.head_size = h[5];
  p.block_size = h[6], p.max_blocks_per_seq = h[8], p.num_blocks = h[9];
  const int64_t x = h[7];  // vLLM K's chunk (key_cache.size(4))
  p.kv_form = static_cast<KvForm>(h[11]);  // each cache's layout (core/kv_layout.h)
  if (p.kv_form == KvForm::kTokenMajor) {
    p.k_layout = token_major_layout(h[12], h[14], h[13], p.head_size);
    p.v_layout = token_major_layout(h[15], h[17], h[16], p.head_size);
  } else {
    p.k_layout = vllm_key_layout(h[12], h[13], p.block_size, x);
    p.v_layout = vllm_value_layout(h[15], h[16], p.block_size);
  }
  p.scale = fl[0], c.k_scale = fl[1], c.v_scale = fl[2], c.atol = fl[3], c.rtol = fl[4];
  p.blocksparse.tp_rank = h[21], p.blocksparse.local_blocks = h[22];
  p.blocksparse.vert_stride = h[23], p.blocksparse.block_size = h[24];
  p.blocksparse.head_sliding_step = h[25];
  p.k_scale = c.k_scale, p.v_scale = c.v_scale;  // float overload: no scale pointers
  std::vector<char> name;
  read_into(f, name, h[20], path);
  c.name.assign(name.begin(), name.end());
  const int64_t qn = int64_t{p.num_seqs} * p.num_heads * p.head_size;
  read_into(f, c.query, qn, path);
  read_into(f, c.k, h[18], path);
  read_into(f, c.v, h[19], path);
  read_into(f, c.tables, int64_t{p.num_seqs} * p.max_blocks_per_seq, path);
  read_into(f, c.lens, p.num_seqs, path);
  if (h[10]) read_into(f, c.alibi, p.num_heads, path);
  read_into(f, c.want, qn, path);
  if (f.peek() != EOF) die(path + ": trailing bytes");
  p.query = c.query.data();  // fp32, contiguous [S, H, D] (the CPU launcher's copy)
  p.q_seq_stride = int64_t{p.num_heads} * p.head_size, p.q_head_stride = p.head_size;
  p.key_cache = c.k.data(), p.value_cache = c.v.data();
  p.block_tables = c.tables.data(), p.seq_lens = c.lens.data();
  p.alibi_slopes = h[10] ? c.alibi.data() : nullptr;
  for (int s = 0; s < p.num_seqs; ++s) p.max_seq_len = std::max(p.max_seq_len, c.lens[s]);
  return c;
}

// The .case files of a folder, sorted; dies when there is none.
inline std::vector<std::string> case_paths(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".case") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  if (paths.empty()) die("no .case files in " + dir);
  return paths;
}

}  // namespace case_file
