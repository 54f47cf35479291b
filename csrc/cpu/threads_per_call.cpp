// threads_per_call.cpp — the idle OpenMP thread policy from the environment, and the per-thread
// K / V minimum that follows from it (threads_per_call.h says why).
#include "threads_per_call.h"

#include <cctype>
#include <cstdlib>

namespace paged_attn {
namespace cpu {
namespace {

constexpr int64_t kMinKvBytesPerSpinningThread = 256 << 10;
constexpr int64_t kMinKvBytesPerSleepingThread = 4 << 20;
constexpr const char* kForceVariable = "PAGED_ATTN_CPU_KV_BYTES_PER_THREAD";

std::string trimmed_lower(const char* value) {
  std::string s;
  for (const char* c = value; *c != '\0'; ++c)
    if (!std::isspace(static_cast<unsigned char>(*c)))
      s += static_cast<char>(std::tolower(static_cast<unsigned char>(*c)));
  return s;
}

// A spin count / block time: 0 (sleep at once) -> 0, "infinite" or a positive count -> 1,
// anything else (which the runtimes ignore) -> -1. A unit or multiplier after the digits
// ("0ms", "300k") does not change whether it is 0.
int zero_or_positive(const std::string& v) {
  if (v == "infinite" || v == "infinity") return 1;
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0]))) return -1;
  return std::strtoull(v.c_str(), nullptr, 10) == 0 ? 0 : 1;
}

IdleThreadPolicy read_policy() {
  for (const char* name : {"GOMP_SPINCOUNT", "KMP_BLOCKTIME"}) {
    const char* raw = std::getenv(name);
    if (raw == nullptr) continue;
    const std::string v = trimmed_lower(raw);
    const int count = zero_or_positive(v);
    if (count >= 0) return {count == 0, std::string(name) + "=" + v};
  }
  if (const char* raw = std::getenv("OMP_WAIT_POLICY")) {
    const std::string v = trimmed_lower(raw);
    if (v == "passive" || v == "active") return {v == "passive", "OMP_WAIT_POLICY=" + v};
  }
  return {false, "default"};
}

}  // namespace

const IdleThreadPolicy& idle_thread_policy() {
  static const IdleThreadPolicy policy = read_policy();
  return policy;
}

int64_t min_kv_bytes_per_thread(std::string* error) {
  if (const char* raw = std::getenv(kForceVariable)) {
    char* end = nullptr;
    const long long v = std::strtoll(raw, &end, 10);
    if (!std::isdigit(static_cast<unsigned char>(raw[0])) || *end != '\0' || v <= 0) {
      *error = std::string(kForceVariable) + "=" + raw + " is not a positive number of bytes";
      return 0;
    }
    return v;
  }
  return idle_thread_policy().sleep ? kMinKvBytesPerSleepingThread : kMinKvBytesPerSpinningThread;
}

bool kv_bytes_per_thread_forced() { return std::getenv(kForceVariable) != nullptr; }

}  // namespace cpu
}  // namespace paged_attn
