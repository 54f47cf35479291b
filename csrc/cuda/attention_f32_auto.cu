// attention_f32_auto.cu — kernel instantiations for one query dtype with an "auto" cache (cache dtype =
// query dtype), plus its v2 reduce kernel. One (dtype, cache) pair per file: parallel builds.
#include "attention_launch.cuh"

namespace paged_attn {
namespace cuda {

template void launch_paged_attention<ScalarKind::kFloat32, CacheKind::kAuto>(
    const PagedAttentionParams&, bool, cudaStream_t);
template void launch_v2_reduce<ScalarKind::kFloat32>(const PagedAttentionParams&, cudaStream_t);

}  // namespace cuda
}  // namespace paged_attn
