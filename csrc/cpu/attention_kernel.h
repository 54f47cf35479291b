// attention_kernel.h — the CPU paged-attention kernel's interface: one call computes the compound
// state of one work item (sequence, KV head, 512-token partition) for all query heads of that KV
// head. Framework-free (no torch header): the launcher (paged_attention_cpu.cpp) turns tensors
// into params, runs these items in parallel and merges the partitions.
//
// One algorithm (partition_kernel.h), one small file of vector primitives per instruction set
// (isa_<name>.cpp), one table of the variants this build holds (kernel_variants.cpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "../core/params.h"

namespace paged_attn {
namespace cpu {

// One work item: tokens [partition * kPartitionSize, min(seq_len, (partition + 1) * ...)) of
// KV heads [kv_head, kv_head + kv_heads) (more than one only where work_items.h allows).
struct PartitionTask {
  int seq;
  int kv_head;
  int partition;
  int kv_heads = 1;
};

// Everything a work item reads besides PagedAttentionParams, resolved once per call.
struct KernelInputs {
  const float* query;  // [num_seqs, num_heads, head_size] contiguous fp32 copy of the query
  float qk_scale;      // scale * k_scale (k_scale only for fp8 caches, else 1)
  float v_scale;       // v_scale for fp8 caches, else 1
  // Per-partition results, [num_seqs, num_heads, num_partitions(, head_size)] contiguous:
  float* max_logits;   // m_p
  float* exp_sums;     // s_p = sum_t exp(l_t - m_p)
  float* part_out;     // sum_t exp(l_t - m_p) v_t / s_p (fp32; normalised by its own sum)
  int num_partitions;  // the partition dimension of the three arrays above
};

// Floats of per-thread scratch a kernel needs for these params and items of kv_heads_per_item KV
// heads (allocated by the caller, reused across the work items a thread runs).
size_t kernel_scratch_floats(const PagedAttentionParams& p, int kv_heads_per_item);

// Computes one work item and writes m_p, s_p and the normalised output of partition
// `task.partition` for query heads kv_head * G .. (kv_head + kv_heads) * G - 1 (G = num_heads /
// num_kv_heads). The partition must hold at least one token.
// `next`: the work item this thread runs after this one, or null; a kernel may prefetch its
// K / V while this one computes (a hint: it changes no result).
// NOTE: cache slots past seq_len are never multiplied into the output (masked loads), so NaN
// there cannot leak; every block offset is computed in 64 bits.
using PartitionKernel = void (*)(const PagedAttentionParams& p, const KernelInputs& in,
                                 PartitionTask task, const PartitionTask* next, float* scratch);

// The instruction-set level a variant needs, for capping by the framework's own CPU capability
// (ATEN_CPU_CAPABILITY=avx2 must keep us off AVX-512 too).
enum class IsaLevel : int { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

// One compiled variant of the kernel.
struct KernelVariant {
  const char* name;        // what info / check / bench print and PAGED_ATTN_CPU_KERNEL takes
  IsaLevel level;          // capped by the framework's CPU capability
  bool (*cpu_supports)();  // this CPU can execute it (CPUID on x86, HWCAP on aarch64)
  PartitionKernel run;
  // nullptr, or: on a CPU where this variant runs but was measured slower than the next entry
  // of the table, the reason in words (else nullptr). kernel_choice.cpp then ranks it after
  // that entry, so that "best first" holds for the CPU at hand.
  const char* (*slower_here)();
  // nullptr, or the calls this variant computes itself, in words, where it hands the others to
  // another variant's code (info prints it).
  const char* scope;
};

// The variants this build holds, best first on the CPUs they were measured on (kernel_choice.cpp
// reorders by slower_here; the first runnable one is the default).
// *count receives their number.
const KernelVariant* kernel_variants(int* count);

// Each ISA file defines, in its own namespace, the kernel entry point and the CPU check.
#define PA_DECLARE_KERNEL_VARIANT(isa)                                                     \
  namespace isa {                                                                          \
  void attention_partition(const PagedAttentionParams& p, const KernelInputs& in,          \
                           PartitionTask task, const PartitionTask* next, float* scratch); \
  bool cpu_supports();                                                                     \
  }

}  // namespace cpu
}  // namespace paged_attn
