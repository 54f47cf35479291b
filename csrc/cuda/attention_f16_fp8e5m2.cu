// attention_f16_fp8e5m2.cu — kernel instantiations for one query dtype with an fp8 e5m2 cache.
// One (dtype, cache) pair per file so the build compiles them in parallel.
#include "attention_launch.cuh"

namespace paged_attn {
namespace cuda {

template void launch_paged_attention<ScalarKind::kFloat16, CacheKind::kFp8E5M2>(
    const PagedAttentionParams&, bool, cudaStream_t);

}  // namespace cuda
}  // namespace paged_attn
