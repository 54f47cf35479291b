// ops.cpp — THE TORCH_LIBRARY(paged_attn) block: every op schema is defined here, from the one
// list in paged_attention_ext/schemas.py, which the build writes as C++ string literals into
// build/generated/paged_attn_schemas.inc (setup.py, CMakeLists.txt).
//
// Kernels register themselves elsewhere: csrc/cpu/*.cpp (CPU) and csrc/cuda/*.cu (CUDA), through
// PAGED_ATTN_REGISTER_KERNELS (torch_glue/overloads.h); the Python package adds the fake (meta)
// kernels and a CompositeExplicitAutograd fallback for any other device.
// NOTE: the list puts each `.scale_tensor` overload BEFORE its float twin: torch.ops picks the
// first overload that matches, and a tensor passed to a `float` argument would otherwise be
// converted through __float__ (a host sync) instead of reaching the tensor overload.
#include <torch/library.h>

namespace {

const char* const kSchemas[] = {
#include "paged_attn_schemas.inc"
};

}  // namespace

TORCH_LIBRARY(paged_attn, m) {
  // The fake (meta) kernels live in Python: torch.compile / opcheck on an op whose fake kernel is
  // missing (this library loaded without the package) import that module or say it must be.
  m.set_python_module("paged_attention_ext._registration");
  for (const char* schema : kSchemas) m.def(schema);
}
