// kernel_choice.h — which CPU kernel variant (attention_kernel.h) runs: the best one this CPU
// executes, capped by torch's own CPU capability (ATEN_CPU_CAPABILITY=avx2 caps us too), unless
// PAGED_ATTN_CPU_KERNEL=<name> asks for another. Read on every call (tests switch it).
#pragma once

#include <string>
#include <vector>

#include "attention_kernel.h"

namespace paged_attn {
namespace cpu {

struct VariantStatus {
  const KernelVariant* variant;
  bool runnable;     // the CPU supports it and torch's capability does not cap it
  std::string note;  // not runnable: why; runnable but ranked below the next entry of the
                     // build's table (KernelVariant::slower_here): why; else empty
};

// Every variant of this build, best first for this CPU.
const std::vector<VariantStatus>& variant_statuses();

// The variant to run now, or nullptr with *error set (PAGED_ATTN_CPU_KERNEL names an unknown
// variant or one this CPU cannot run).
const KernelVariant* choose_variant(std::string* error);

}  // namespace cpu
}  // namespace paged_attn
