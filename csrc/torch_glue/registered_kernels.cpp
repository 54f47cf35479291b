// registered_kernels.cpp — the record of registered_kernels.h.
#include "registered_kernels.h"

namespace paged_attn {
namespace {

// A function-local static: the registrations run during static initialisation of other files.
std::vector<RegisteredKernel>& records() {
  static std::vector<RegisteredKernel> kernels;
  return kernels;
}

}  // namespace

void record_kernel(const char* dispatch_key, const char* op) {
  records().push_back({dispatch_key, op});
}

const std::vector<RegisteredKernel>& registered_kernels() { return records(); }

}  // namespace paged_attn
