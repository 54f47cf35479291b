// cuda_arch.h — can a CUDA build run on a GPU? Host-only, no torch, no CUDA: pure functions over
// the list of compiled images ("sm_75,sm_80,compute_120") and a compute capability.
//
// The C++ twin of paged_attention_ext/tools/cuda_arch.py (which has the rules and their sources);
// tests/test_cuda_arch.py feeds both the same table and checks they agree, including the text
// of the error. ops_cuda.cpp calls these once per device, before the first launch there.
//   - SASS sm_XY runs on X.Z with Z >= Y (same major); sm_XYa only on X.Y; sm_XYf on X.Z, Z >= Y.
//   - PTX compute_XY runs (JIT) on any capability >= X.Y; compute_XYa only on X.Y;
//     compute_XYf on X.Z, Z >= Y.
//   - The driver prefers SASS (the newest that fits), else the newest PTX that fits.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace paged_attn {
namespace arch {

struct Target {
  int major = 0;
  int minor = 0;
  char variant = '\0';  // '\0', 'a' (arch-specific) or 'f' (family)
  bool ptx = false;

  std::string name() const {
    std::string s = ptx ? "compute_" : "sm_";
    s += std::to_string(major) + std::to_string(minor);
    if (variant != '\0') s += variant;
    return s;
  }

  bool runs_on(int cc_major, int cc_minor) const {
    if (variant == 'a') return cc_major == major && cc_minor == minor;
    if (variant == 'f' || !ptx) return cc_major == major && cc_minor >= minor;
    return cc_major > major || (cc_major == major && cc_minor >= minor);
  }

  bool operator<(const Target& o) const {
    if (major != o.major) return major < o.major;
    if (minor != o.minor) return minor < o.minor;
    if (variant != o.variant) return variant < o.variant;
    return ptx < o.ptx;
  }
  bool operator==(const Target& o) const {
    return major == o.major && minor == o.minor && variant == o.variant && ptx == o.ptx;
  }
};

// One name ("sm_80", "compute_120", "sm_90a") -> target; false when it is not one.
inline bool parse_target(const std::string& name, Target& out) {
  std::string rest;
  Target t;
  if (name.rfind("sm_", 0) == 0) {
    rest = name.substr(3);
  } else if (name.rfind("compute_", 0) == 0) {
    rest = name.substr(8);
    t.ptx = true;
  } else {
    return false;
  }
  if (!rest.empty() && (rest.back() == 'a' || rest.back() == 'f')) {
    t.variant = rest.back();
    rest.pop_back();
  }
  if (rest.size() < 2 || rest.size() > 4) return false;
  for (char c : rest)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  t.major = std::stoi(rest.substr(0, rest.size() - 1));
  t.minor = rest.back() - '0';
  out = t;
  return true;
}

// "sm_75,sm_80:compute_120 ..." (separators: comma, colon, space) -> sorted unique targets.
// Returns false when a name is not a target (the valid ones are still returned).
inline bool parse_targets(const std::string& list, std::vector<Target>& out) {
  out.clear();
  bool ok = true;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    Target t;
    if (parse_target(cur, t)) {
      out.push_back(t);
    } else {
      ok = false;
    }
    cur.clear();
  };
  for (char c : list) {
    if (c == ',' || c == ':' || c == ' ' || c == '\t' || c == '\n') {
      flush();
    } else {
      cur += c;
    }
  }
  flush();
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return ok;
}

struct Match {
  bool runs = false;
  int index = -1;  // into the targets: the image the driver would pick
};

inline Match match(int cc_major, int cc_minor, const std::vector<Target>& targets) {
  Match best;
  for (int want_ptx = 0; want_ptx < 2 && !best.runs; ++want_ptx) {
    for (int i = 0; i < static_cast<int>(targets.size()); ++i) {
      const Target& t = targets[i];
      if (t.ptx != (want_ptx == 1) || !t.runs_on(cc_major, cc_minor)) continue;
      if (!best.runs) {
        best = {true, i};
        continue;
      }
      const Target& b = targets[best.index];
      // newest (major, minor); at a tie the variant image (built for exactly this family)
      if (t.major > b.major || (t.major == b.major && t.minor > b.minor) ||
          (t.major == b.major && t.minor == b.minor && b.variant == '\0' && t.variant != '\0'))
        best.index = i;
    }
  }
  return best;
}

inline std::string rebuild_command(int cc_major, int cc_minor) {
  return "TORCH_CUDA_ARCH_LIST=" + std::to_string(cc_major) + "." + std::to_string(cc_minor) +
         " pip install --no-build-isolation -e .";
}

inline std::string compiled_text(const std::vector<Target>& targets) {
  if (targets.empty()) return "no CUDA archs";
  std::string s;
  for (size_t i = 0; i < targets.size(); ++i) s += (i ? ", " : "") + targets[i].name();
  return s;
}

// The error on a GPU the build does not cover (same text as cuda_arch.py mismatch_message).
inline std::string mismatch_message(int cc_major, int cc_minor, const std::vector<Target>& targets,
                                    const std::string& device) {
  const std::string cc = std::to_string(cc_major) + "." + std::to_string(cc_minor);
  const std::string sm = "sm_" + std::to_string(cc_major) + std::to_string(cc_minor);
  return "paged_attn: the CUDA kernels of this build cannot run on " + device +
         " (compute capability " + cc + ", " + sm + "): they were compiled for " +
         compiled_text(targets) + ". Rebuild for this GPU in the paged_attention_ext checkout: `" +
         rebuild_command(cc_major, cc_minor) +
         "` (a build with TORCH_CUDA_ARCH_LIST unset on a machine with this GPU does the same), "
         "or set PAGED_ATTN_DISABLE_EXTENSION=1 to run the PyTorch implementation instead.";
}

// The error when the list says the build fits but the driver cannot load our kernels (e.g. a
// driver older than the toolkit that wrote the PTX): `cuda_error` is the driver's answer.
inline std::string load_failure_message(int cc_major, int cc_minor,
                                        const std::vector<Target>& targets,
                                        const std::string& device, const std::string& cuda_error) {
  const std::string cc = std::to_string(cc_major) + "." + std::to_string(cc_minor);
  return "paged_attn: the CUDA driver cannot load this build's kernels on " + device +
         " (compute capability " + cc + "; compiled for " + compiled_text(targets) + "): " +
         cuda_error +
         ". If the GPU is only covered by PTX, the driver must be at least as new as the CUDA "
         "toolkit that built the extension; update the driver, or rebuild for this GPU in the "
         "paged_attention_ext checkout: `" + rebuild_command(cc_major, cc_minor) +
         "`, or set PAGED_ATTN_DISABLE_EXTENSION=1 to run the PyTorch implementation instead.";
}

}  // namespace arch
}  // namespace paged_attn
