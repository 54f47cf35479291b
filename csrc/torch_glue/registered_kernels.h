// registered_kernels.h — which kernels this library registered, per dispatch key: overloads.h
// records each one as a TORCH_LIBRARY_IMPL block registers it (when the library loads), and
// paged_attention_ext.build_info() reports them. No torch header.
#pragma once

#include <string>
#include <vector>

namespace paged_attn {

struct RegisteredKernel {
  std::string dispatch_key;  // "CPU", "CUDA"
  std::string op;            // "v1", "v1.scale_tensor", ...
};

void record_kernel(const char* dispatch_key, const char* op);

// In registration order.
const std::vector<RegisteredKernel>& registered_kernels();

}  // namespace paged_attn
