// kernel_choice.cu — the definitions of kernel_choice.h (host code only, no CUDA call:
// tests/test_kernel_choice_host.py compiles it with the host compiler).
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "kernel_choice.h"

namespace paged_attn {
namespace cuda {
namespace {

constexpr const char* kEnvVar = "PAGED_ATTN_CUDA_KERNEL";
constexpr int kMinPipelinedArch = 80;  // cp.async, ldmatrix, mma.sync with bf16: sm_80

// The setting: -1 not read yet, else one of these.
enum Setting : int {
  kAuto = 0,
  kForceBaseline = 1,
  kForcePipelined = 2,
  kForceMma = 3,
  kInvalid = 4
};
std::atomic<int> g_setting{-1};
std::string g_value;  // the raw value (set under g_mutex before g_setting is published)
std::mutex g_mutex;

std::array<std::atomic<uint64_t>, kNumAttentionKernels> g_launches{};

int read_setting_locked() {
  const char* env = std::getenv(kEnvVar);
  g_value = env != nullptr ? env : "";
  if (g_value.empty() || g_value == "auto") return kAuto;
  if (g_value == "baseline") return kForceBaseline;
  if (g_value == "pipelined") return kForcePipelined;
  if (g_value == "mma") return kForceMma;
  return kInvalid;
}

int setting() {
  int s = g_setting.load(std::memory_order_acquire);
  if (s >= 0) return s;
  const std::lock_guard<std::mutex> lock(g_mutex);
  s = g_setting.load(std::memory_order_acquire);
  if (s < 0) {
    s = read_setting_locked();
    g_setting.store(s, std::memory_order_release);
  }
  return s;
}

std::string invalid_message() {
  return std::string(kEnvVar) + "='" + g_value +
         "' is not a CUDA attention kernel: use baseline, pipelined, mma, or auto (or leave it "
         "unset)";
}

}  // namespace

const char* attention_kernel_name(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::kPipelined: return "pipelined";
    case AttentionKernel::kMma: return "mma";
    default: return "baseline";
  }
}

AttentionKernel choose_attention_kernel(int device, int code_arch, std::string* error) {
  const int s = setting();
  if (s == kForceBaseline) return AttentionKernel::kBaseline;
  if (s == kInvalid) {
    *error = invalid_message();
    return AttentionKernel::kBaseline;
  }
  if (code_arch >= kMinPipelinedArch)
    return s == kForcePipelined ? AttentionKernel::kPipelined : AttentionKernel::kMma;
  if (s == kForcePipelined || s == kForceMma) {
    *error = std::string(kEnvVar) + "=" + g_value +
             " needs code compiled for sm_80 or newer (cp.async, ldmatrix, mma.sync); cuda:" +
             std::to_string(device) + " runs this build's code for sm_" +
             std::to_string(code_arch) +
             ": use baseline, or rebuild for the GPU's arch (TORCH_CUDA_ARCH_LIST)";
  }
  return AttentionKernel::kBaseline;
}

std::string attention_kernel_setting() {
  switch (setting()) {
    case kForceBaseline: return std::string("baseline (") + kEnvVar + "=baseline)";
    case kForcePipelined: return std::string("pipelined (") + kEnvVar + "=pipelined)";
    case kForceMma: return std::string("mma (") + kEnvVar + "=mma)";
    case kInvalid: return "error: " + invalid_message();
    default: return "auto: mma where the code that runs is compiled for sm_80+, else baseline";
  }
}

void reload_attention_kernel_setting() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_setting.store(read_setting_locked(), std::memory_order_release);
}

void count_attention_launch(AttentionKernel kernel) {
  g_launches[static_cast<int>(kernel)].fetch_add(1, std::memory_order_relaxed);
}

uint64_t attention_launches(AttentionKernel kernel) {
  return g_launches[static_cast<int>(kernel)].load(std::memory_order_relaxed);
}

}  // namespace cuda
}  // namespace paged_attn
