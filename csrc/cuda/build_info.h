// build_info.h — what the CUDA part of this build compiled, for paged_attention_ext.build_info()
// (module.cpp) and the arch check of ops_cuda.cpp. Plain C++: no torch, no CUDA header. Defined in
// build_info.cu from the owners of each fact: dispatch.cuh's lists and the build's -gencode flags.
#pragma once

#include <vector>

namespace paged_attn {
namespace cuda {

// The images compiled into this library, colon-separated ("sm_75:sm_80:compute_120"): the value
// of -DPAGED_ATTN_CUDA_ARCHS, which setup.py / CMakeLists.txt derive from the real -gencode flags.
// "" when the build did not say (then only the driver's probe decides).
const char* compiled_archs();

struct AttentionPairName {
  const char* query_dtype;     // "float32", "float16", "bfloat16"
  const char* kv_cache_dtype;  // "auto", "fp8_e4m3", "fp8_e5m2"
};

// dispatch.cuh kAttentionPairs, named.
std::vector<AttentionPairName> attention_pairs();

// dispatch.cuh kHeadSizes.
std::vector<int> head_sizes();

// The CUDA runtime version the build compiled against (CUDART_VERSION, e.g. 13000).
int cuda_runtime_version();

}  // namespace cuda
}  // namespace paged_attn
