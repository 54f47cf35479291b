// isa_amx.cpp — the "amx" variant of the CPU kernel: a bf16 cache's QK and P.V on AMX tiles
// (TDPBF16PS: a tile of up to 16 x 16 fp32 sums += 16 x 32 bf16 times 32 x 16 bf16 in one
// instruction), everything else of the algorithm (spans, softmax, prefetch, short items) is
// partition_kernel.h's on the AVX-512 layer (avx512_layer.h). Other caches, and the bf16 shapes
// the tiles do not serve (tiles_serve below), run avx512's code: this file compiles the
// algorithm for the BF16Tiles cache only.
//
// Tiles per work item (the G query heads of one KV head, in head tiles):
//   QK, token-major (NHD / HND): C[16 tokens][heads] += A = K [16 tokens x 32 dims] straight
//     from the cache (row stride: the token stride) x B = the query transposed into dim pairs
//     [16 pairs][heads]. A last chunk of head_size % 32 dims is staged, zero padded.
//   QK, vLLM's layout (K [D / 8][bs][8]): B = 16 K rows x 64 bytes (4 tokens x 8 dims each)
//     straight from the cache, A = the query as rows (head g, j) of the dim pairs (8 c + 2 j,
//     8 c + 2 j + 1) of K row c: C row (g, j) lane 4 u + j' holds token u's pair j' against q's
//     pair j, so the lanes j' == j summed over j are 4 tokens' logits ("diagonal" form: one
//     TDPBF16PS covers 4 tokens x up to 128 dims).
//   PV, token-major: C[2 heads][16] += A = P as rows (p, 0) and (0, p) [16 tokens] x B = V
//     [16 tokens x 32 dims] straight from the cache: C row g holds the even dims, row gm + g the
//     odd ones; interleaved when the output is stored.
//   PV, vLLM's layout (V [D][bs]): C[16 dims][heads] += A = V [16 dims x 32 tokens] straight from
//     the cache x B = P transposed into token pairs [16 pairs][heads].
// Probabilities are rounded to bf16 for PV (as avx512-bf16's vdpbf16ps path); QK sums are fp32.
// NaN safety: a chunk of tokens partly outside the partition copies its V rows, zeroed outside,
// into a staging buffer (p = 0 times NaN is NaN); K needs none (a token's K reaches only its own
// logit, and logits outside the partition are never read). The tile configuration is loaded twice
// per work item (QK, PV: ~120 cycles each) and the tiles are released at the end of the item.
#include "kernel_common.h"
#include "x86_f16c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <vector>

namespace paged_attn {
namespace cpu {

PA_DECLARE_KERNEL_VARIANT(avx512)  // the code for everything the tiles do not serve
PA_DECLARE_KERNEL_VARIANT(amx)

namespace amx {

// Per-thread scratch of the tile code (grows, never shrinks; compiled for the baseline ISA:
// std::vector's code must not be emitted with AMX / AVX-512 instructions), 64-byte aligned: a
// tile row that straddles two cache lines made tileloadd ~3x slower (measured here), and
// malloc aligns to 16 bytes only.
float* tile_scratch(size_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < floats + 15) buffer.resize(floats + 15);
  const uintptr_t at = reinterpret_cast<uintptr_t>(buffer.data());
  return buffer.data() + ((64 - at % 64) % 64) / sizeof(float);
}

}  // namespace amx
}  // namespace cpu
}  // namespace paged_attn

// Everything below is compiled for AVX-512 + AMX and runs only after cpu_supports().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16,amx-tile,amx-bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16,amx-tile,amx-bf16")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside _mm512_reduce_* / masks
#endif

#define PA_ISA amx
#include "avx512_layer.h"

#include "amx_tiles.h"

#include "partition_kernel.h"
#undef PA_ISA

namespace paged_attn {
namespace cpu {
namespace amx {

// The bf16 shapes the tiles serve: 3 or more query heads per KV head (with 1 or 2, avx512's
// FMAs took 2-8% less time in cache: the tiles' rows of heads are mostly empty); blocks of whole
// 16-token chunks; vLLM's layout also needs head dims in whole 16-row tiles and at most two
// chunks of 16 K rows (head_size <= 256).
bool tiles_serve(const PagedAttentionParams& p) {
  if (p.cache_kind != CacheKind::kAuto || p.scalar_kind != ScalarKind::kBFloat16) return false;
  if (p.num_heads < 3 * p.num_kv_heads || p.block_size % 16 != 0) return false;
  if (p.kv_form == KvForm::kVllm) return p.head_size % 16 == 0 && p.head_size <= 256;
  return true;
}

void attention_partition(const PagedAttentionParams& p, const KernelInputs& in, PartitionTask task,
                         const PartitionTask* next, float* scratch) {
  if (!tiles_serve(p)) return avx512::attention_partition(p, in, task, next, scratch);
  if (p.kv_form == KvForm::kTokenMajor)
    return run_partition<BF16Tiles, KvForm::kTokenMajor>(p, in, task, next, scratch);
  return run_partition<BF16Tiles, KvForm::kVllm>(p, in, task, next, scratch);
}

}  // namespace amx
}  // namespace cpu
}  // namespace paged_attn

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace paged_attn {
namespace cpu {
namespace amx {

// AVX-512 (avx512's check) + AVX512_BF16 + AMX-TILE + AMX-BF16 (CPUID leaf 7), and Linux grants
// this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA: without it
// the first tile instruction faults).
bool cpu_supports() {
  static const bool ok = [] {
    if (!avx512::cpu_supports() || !__builtin_cpu_supports("avx512bf16")) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool amx_bf16 = (d >> 22) & 1u, amx_tile = (d >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

}  // namespace amx
}  // namespace cpu
}  // namespace paged_attn

#endif  // x86-64
