// kernel_choice.cpp — see kernel_choice.h.
#include "kernel_choice.h"

#include <ATen/Version.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace paged_attn {
namespace cpu {
namespace {

// torch's CPU capability as an IsaLevel: on x86 "AVX512" / "AVX2" / "DEFAULT" (what
// ATEN_CPU_CAPABILITY sets); elsewhere no cap (NEON is the aarch64 baseline).
IsaLevel torch_isa_cap(std::string* name) {
  *name = at::get_cpu_capability();
#if defined(__x86_64__)
  if (name->find("AVX512") != std::string::npos) return IsaLevel::kAvx512;
  if (name->find("AVX2") != std::string::npos) return IsaLevel::kAvx2;
  return IsaLevel::kBaseline;
#else
  return IsaLevel::kAvx512;
#endif
}

std::vector<VariantStatus> probe() {
  std::string torch_cap;
  const IsaLevel cap = torch_isa_cap(&torch_cap);
  int n = 0;
  const KernelVariant* variants = kernel_variants(&n);
  std::vector<VariantStatus> out;
  for (int i = 0; i < n; ++i) {
    VariantStatus s{&variants[i], true, ""};
    if (!variants[i].cpu_supports()) {
      s.runnable = false;
      s.note = "this CPU lacks its instructions";
    } else if (static_cast<int>(variants[i].level) > static_cast<int>(cap)) {
      s.runnable = false;
      s.note = "torch's CPU capability is " + torch_cap + " (ATEN_CPU_CAPABILITY)";
    }
    out.push_back(s);
  }
  // A runnable variant measured slower on this CPU than the runnable one after it trades places
  // with it: "best first" is about the CPU at hand.
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    const char* why = out[i].variant->slower_here ? out[i].variant->slower_here() : nullptr;
    if (why != nullptr && out[i].runnable && out[i + 1].runnable) {
      out[i].note = std::string("ranked after ") + out[i + 1].variant->name + " here: " + why;
      std::swap(out[i], out[i + 1]);
      ++i;
    }
  }
  return out;
}

}  // namespace

const std::vector<VariantStatus>& variant_statuses() {
  static const std::vector<VariantStatus> statuses = probe();
  return statuses;
}

const KernelVariant* choose_variant(std::string* error) {
  const auto& statuses = variant_statuses();
  const char* wanted = std::getenv("PAGED_ATTN_CPU_KERNEL");
  if (wanted == nullptr || *wanted == '\0') {
    for (const auto& s : statuses)
      if (s.runnable) return s.variant;
    *error = "no CPU kernel variant of this build runs on this CPU";
    return nullptr;
  }
  std::string names;
  for (const auto& s : statuses) {
    if (std::strcmp(s.variant->name, wanted) == 0) {
      if (s.runnable) return s.variant;
      *error = std::string("PAGED_ATTN_CPU_KERNEL=") + wanted + " cannot run here: " + s.note;
      return nullptr;
    }
    names += names.empty() ? "" : ", ";
    names += s.variant->name;
  }
  *error = std::string("PAGED_ATTN_CPU_KERNEL=") + wanted +
           " is not a CPU kernel variant of this build (it has: " + names + ")";
  return nullptr;
}

}  // namespace cpu
}  // namespace paged_attn
