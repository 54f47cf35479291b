// kernel_choice.cu — the definitions of kernel_choice.h (host code only, no CUDA call:
// tests/test_kernel_choice_host.py compiles it with the host compiler).
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "../core/split_plan.h"
#include "kernel_choice.h"
#include "kernel_families.h"

namespace paged_attn {
namespace cuda {
namespace {

constexpr const char* kEnvVar = "PAGED_ATTN_CUDA_KERNEL";
constexpr const char* kSplitEnvVar = "PAGED_ATTN_CUDA_SPLIT";
constexpr const char* kPdlEnvVar = "PAGED_ATTN_CUDA_PDL";

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
// The split aim, read with g_setting (under g_mutex, before it is published); g_split_ok false:
// a bad value, g_split_value says which.
SplitAim g_split{kSplitBlocksPerSm, kMinPartitionTiles};
bool g_split_ok = true;
std::string g_split_value;

// PAGED_ATTN_CUDA_PDL, read with g_setting: 0 off, 1 on, -1 a bad value (g_pdl_value says which).
int g_pdl = 0;
std::string g_pdl_value;

std::array<std::atomic<uint64_t>, kNumAttentionKernels> g_launches{};

// A decimal integer in [1, max], else -1 (no sign, no spaces, at most 4 digits).
int parse_count(const std::string& text, int max) {
  if (text.empty() || text.size() > 4 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  const int n = std::stoi(text);
  return n >= 1 && n <= max ? n : -1;
}

// PAGED_ATTN_CUDA_SPLIT's value: "" / "auto", "off", "B" or "B:T"; false when it is none of them.
bool parse_split(const std::string& value, SplitAim* aim) {
  *aim = SplitAim{kSplitBlocksPerSm, kMinPartitionTiles};
  if (value.empty() || value == "auto") return true;
  if (value == "off") {
    aim->blocks_per_sm = 0;
    return true;
  }
  const size_t colon = value.find(':');
  const int blocks = parse_count(value.substr(0, colon), kMaxSplitBlocksPerSm);
  const int tiles = colon == std::string::npos
                        ? kMinPartitionTiles
                        : parse_count(value.substr(colon + 1), kMaxSplitMinTiles);
  if (blocks < 0 || tiles < 0) return false;
  *aim = SplitAim{blocks, tiles};
  return true;
}

int read_setting_locked() {
  const char* split_env = std::getenv(kSplitEnvVar);
  g_split_value = split_env != nullptr ? split_env : "";
  g_split_ok = parse_split(g_split_value, &g_split);
  const char* pdl_env = std::getenv(kPdlEnvVar);
  g_pdl_value = pdl_env != nullptr ? pdl_env : "";
  if (g_pdl_value.empty() || g_pdl_value == "0" || g_pdl_value == "off") g_pdl = 0;
  else if (g_pdl_value == "1" || g_pdl_value == "on") g_pdl = 1;
  else g_pdl = -1;
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
  if (s == kInvalid) {
    *error = invalid_message();
    return AttentionKernel::kBaseline;
  }
  if (s == kForceBaseline) {
    if (!baseline_compiled_for(code_arch)) {
      *error = std::string(kEnvVar) + "=baseline: this build has no baseline kernel in its code "
               "for sm_80 and newer (cuda:" + std::to_string(device) + " runs its sm_" +
               std::to_string(code_arch) + " code); rebuild with PAGED_ATTN_CUDA_BASELINE=1";
    }
    return AttentionKernel::kBaseline;
  }
  if (pipelined_compiled_for(code_arch))
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

SplitAim split_aim(std::string* error) {
  setting();  // reads both variables once
  if (!g_split_ok) {
    *error = std::string(kSplitEnvVar) + "='" + g_split_value +
             "' is not a split setting: use auto, off, B or B:T (aim at B thread blocks per SM, " +
             "1-" + std::to_string(kMaxSplitBlocksPerSm) + "; partitions of at least T tiles of " +
             "128 tokens, 1-" + std::to_string(kMaxSplitMinTiles) + ")";
  }
  return g_split;
}

std::string split_setting() {
  std::string error;
  const SplitAim aim = split_aim(&error);
  if (!error.empty()) return "error: " + error;
  const std::string forced = " (" + std::string(kSplitEnvVar) + "=" + g_split_value + ")";
  if (aim.blocks_per_sm == 0) return "off" + forced;
  const std::string text = std::to_string(aim.blocks_per_sm) + " blocks per SM, partitions of >= " +
                           std::to_string(aim.min_partition_tiles) +
                           (aim.min_partition_tiles == 1 ? " tile" : " tiles");
  return g_split_value.empty() || g_split_value == "auto" ? "auto: " + text : text + forced;
}

bool programmatic_reduce_launch(int code_arch, std::string* error) {
  setting();  // reads the variables once
  if (g_pdl < 0) {
    *error = std::string(kPdlEnvVar) + "='" + g_pdl_value +
             "' is not a PDL setting: use 1 or on, 0 or off (or leave it unset)";
    return false;
  }
  return g_pdl == 1 && code_arch >= kMinPdlArch;
}

std::string pdl_setting() {
  std::string error;
  programmatic_reduce_launch(kMinPdlArch, &error);
  if (!error.empty()) return "error: " + error;
  if (g_pdl == 0) return "off";
  return "on where the code that runs is compiled for sm_" + std::to_string(kMinPdlArch) +
         "+ (" + kPdlEnvVar + "=" + g_pdl_value + ")";
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
