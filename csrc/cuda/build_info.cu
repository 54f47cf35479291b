// build_info.cu — the definitions of build_info.h.
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <iterator>
#include <utility>

#include "build_info.h"
#include "dispatch.cuh"
#include "launch.h"

namespace paged_attn {
namespace cuda {
namespace {

#define PA_STRINGIFY_(...) #__VA_ARGS__
#define PA_STRINGIFY(...) PA_STRINGIFY_(__VA_ARGS__)
#ifdef PAGED_ATTN_CUDA_ARCHS
constexpr const char* kCompiledArchs = PA_STRINGIFY(PAGED_ATTN_CUDA_ARCHS);
#else
constexpr const char* kCompiledArchs = "";
#endif

const char* scalar_name(ScalarKind s) {
  switch (s) {
    case ScalarKind::kFloat32: return "float32";
    case ScalarKind::kFloat16: return "float16";
    case ScalarKind::kBFloat16: return "bfloat16";
  }
  return "?";
}

const char* cache_name(CacheKind c) {
  switch (c) {
    case CacheKind::kAuto: return "auto";
    case CacheKind::kFp8E4M3: return "fp8_e4m3";
    case CacheKind::kFp8E5M2: return "fp8_e5m2";
  }
  return "?";
}

using AttentionLauncher = void (*)(const PagedAttentionParams&, cudaStream_t);

template <std::size_t... I>
constexpr auto launchers_of(std::index_sequence<I...>) {
  return std::array<AttentionLauncher, 2 * sizeof...(I)>{
      &launch_paged_attention<kAttentionPairs[I].scalar, kAttentionPairs[I].cache>...,
      &launch_paged_attention_pipelined<kAttentionPairs[I].scalar, kAttentionPairs[I].cache>...};
}

}  // namespace

// Both launchers (baseline, pipelined) of every listed pair, with external linkage so that they
// are emitted: each entry is a reference to the explicit instantiation in
// attention_<dtype>_<cache>.cu, and a listed pair that no file instantiates is an undefined symbol
// when the library loads.
extern const std::array<AttentionLauncher, 2 * std::size(kAttentionPairs)> kAttentionLaunchers;
const std::array<AttentionLauncher, 2 * std::size(kAttentionPairs)> kAttentionLaunchers =
    launchers_of(std::make_index_sequence<std::size(kAttentionPairs)>{});

const char* compiled_archs() { return kCompiledArchs; }

std::vector<AttentionPairName> attention_pairs() {
  std::vector<AttentionPairName> names;
  for (const AttentionPair& pair : kAttentionPairs)
    names.push_back({scalar_name(pair.scalar), cache_name(pair.cache)});
  return names;
}

std::vector<int> head_sizes() {
  return std::vector<int>(std::begin(kHeadSizes), std::end(kHeadSizes));
}

int cuda_runtime_version() { return CUDART_VERSION; }

}  // namespace cuda
}  // namespace paged_attn
