// cache_driver.cpp — runs the CUDA reshape_and_cache kernel (csrc/cuda/reshape_and_cache_kernel.cuh;
// both ops: vLLM's caches and token-major ones) in the host simulation (cuda_sim.h) on the case
// files tests/test_cuda_host_sim.py writes, as reshape_and_cache.cu launches it, and writes the
// caches back (CASE.k.out, CASE.v.out) for the test to compare with the oracle's, bit for bit.
//
// Case file (little-endian): "RCCASE1\0", int64[23] (the order of HEADER below), float32[2]
// (k_scale, v_scale), then the bytes of key, value, slot_mapping (int64 [num_tokens]), the K
// cache and the V cache, each from its first element to the end of its storage.
//
// Usage: cache_driver CASE...      Exit 0 when every case ran, 2 on bad input, 3 on a
// simulation error.
#include "cuda_sim.h"  // first: the CUDA keywords the kernels use

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "core/kv_layout.h"
#include "core/params.h"
#include "cross/case_file.h"  // die, read_into
#include "cuda/reshape_and_cache_kernel.cuh"

using namespace paged_attn;
using namespace paged_attn::cuda;
using case_file::die;

namespace {

constexpr int kCacheThreads = 256;  // as reshape_and_cache.cu

enum Header {
  kScalarKind, kCacheKind, kNumTokens, kNumKvHeads, kHeadSize, kBlockSize, kNumBlocks, kKvForm,
  kX, kKBlockStride, kKHeadStride, kKTokenStride, kVBlockStride, kVHeadStride, kVTokenStride,
  kKeyTokenStride, kKeyHeadStride, kValueTokenStride, kValueHeadStride, kKeyBytes, kValueBytes,
  kKCacheBytes, kVCacheBytes, kHeaderInts
};

std::vector<unsigned char> read_bytes(std::ifstream& f, int64_t n, const std::string& path) {
  std::vector<unsigned char> v;
  case_file::read_into(f, v, n, path);
  return v;
}

void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary);
  if (!f.write(reinterpret_cast<const char*>(bytes.data()), bytes.size())) die(path + ": write");
}

template <typename Scalar>
void launch(const ReshapeAndCacheParams& p) {
  const dim3 grid(static_cast<unsigned>(p.num_tokens));
  switch (p.cache_kind) {
    case CacheKind::kAuto:
      cuda_sim::launch(grid, kCacheThreads, 0,
                       [&] { reshape_and_cache_kernel<Scalar, Scalar, kCacheThreads>(p); });
      break;
    case CacheKind::kFp8E4M3:
    case CacheKind::kFp8E5M2:
      cuda_sim::launch(grid, kCacheThreads, 0, [&] {
        reshape_and_cache_kernel<Scalar, uint8_t, kCacheThreads>(
            p, p.cache_kind == CacheKind::kFp8E5M2);
      });
      break;
  }
}

void run(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  int64_t h[kHeaderInts];
  float scales[2];
  if (!f.read(magic, 8) || std::memcmp(magic, "RCCASE1", 8) != 0) die(path + ": bad magic");
  if (!f.read(reinterpret_cast<char*>(h), sizeof h) ||
      !f.read(reinterpret_cast<char*>(scales), sizeof scales))
    die(path + ": truncated header");
  std::vector<unsigned char> key = read_bytes(f, h[kKeyBytes], path);
  std::vector<unsigned char> value = read_bytes(f, h[kValueBytes], path);
  std::vector<unsigned char> slots = read_bytes(f, h[kNumTokens] * 8, path);
  std::vector<unsigned char> k_cache = read_bytes(f, h[kKCacheBytes], path);
  std::vector<unsigned char> v_cache = read_bytes(f, h[kVCacheBytes], path);
  if (f.peek() != EOF) die(path + ": trailing bytes");

  ReshapeAndCacheParams p{};
  p.scalar_kind = static_cast<ScalarKind>(h[kScalarKind]);
  p.cache_kind = static_cast<CacheKind>(h[kCacheKind]);
  p.num_tokens = h[kNumTokens], p.num_kv_heads = h[kNumKvHeads], p.head_size = h[kHeadSize];
  p.block_size = h[kBlockSize], p.num_blocks = h[kNumBlocks];
  if (static_cast<KvForm>(h[kKvForm]) == KvForm::kTokenMajor) {
    p.k_layout = token_major_layout(h[kKBlockStride], h[kKTokenStride], h[kKHeadStride],
                                    p.head_size);
    p.v_layout = token_major_layout(h[kVBlockStride], h[kVTokenStride], h[kVHeadStride],
                                    p.head_size);
  } else {
    p.k_layout = vllm_key_layout(h[kKBlockStride], h[kKHeadStride], p.block_size, h[kX]);
    p.v_layout = vllm_value_layout(h[kVBlockStride], h[kVHeadStride], p.block_size);
  }
  p.key = key.data(), p.value = value.data();
  p.key_token_stride = h[kKeyTokenStride], p.key_head_stride = h[kKeyHeadStride];
  p.value_token_stride = h[kValueTokenStride], p.value_head_stride = h[kValueHeadStride];
  p.key_cache = k_cache.data(), p.value_cache = v_cache.data();
  p.slot_mapping = reinterpret_cast<const int64_t*>(slots.data());
  p.k_scale = scales[0], p.v_scale = scales[1];  // the float overload: no scale pointers
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32: launch<float>(p); break;
    case ScalarKind::kFloat16: launch<__half>(p); break;
    case ScalarKind::kBFloat16: launch<__nv_bfloat16>(p); break;
  }
  write_bytes(path + ".k.out", k_cache);
  write_bytes(path + ".v.out", v_cache);
  std::printf("ran %s\n", path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) die("usage: cache_driver CASE...");
  for (int i = 1; i < argc; ++i) run(argv[i]);
  return 0;
}
