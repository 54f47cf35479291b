"""Which NVIDIA GPU archs the CUDA kernels are built for, and whether a build runs on a GPU.

Pure functions: no torch import at module level, no CUDA call. Used by
  - setup.py (and CMakeLists.txt through `python paged_attention_ext/tools/cuda_arch.py resolve`):
    which TORCH_CUDA_ARCH_LIST to build for (`resolve_arch_list`);
  - `python -m paged_attention_ext info`: can our kernels run on each visible GPU (`match`);
  - tests/test_cuda_arch.py, which feeds the same table of cases to this module and to
    csrc/core/cuda_arch.h, the C++ twin the CUDA ops call before their first launch on a device.

Rules (CUDA programming guide, "binary compatibility" / "PTX compatibility"):
  - SASS for sm_XY runs on compute capability X.Z with Z >= Y (same major only);
    sm_XYa (arch-specific) only on X.Y exactly; sm_XYf (family) on X.Z, Z >= Y.
  - PTX for compute_XY is compiled by the driver (JIT) for any compute capability >= X.Y;
    compute_XYa only for X.Y, compute_XYf for X.Z with Z >= Y. The driver must be new enough
    for the PTX version (nvcc 13.0 emits PTX that needs a CUDA 13.0 driver): that part only the
    driver can tell, and the C++ check asks it (a probe of one kernel) before the first launch.
  - The driver prefers SASS over PTX; `match` does the same.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

# The list built when TORCH_CUDA_ARCH_LIST is unset and no GPU is visible at build time
# (docs/BUILD.md: why these, and what they cost). SASS for T4 (7.5), A100 (8.0; also runs on
# 8.6 / 8.7 / 8.9: A10, RTX 30, Orin, L4, RTX 40), H100/H200 (9.0), B200/GB200 (10.0; also 10.3),
# RTX 50 / RTX PRO (12.0; also 12.1), and PTX of 12.0 for GPUs newer than 12.0.
# NOTE: keep in sync with nothing else: CMakeLists.txt and setup.py read it from here.
DEFAULT_ARCH_LIST = "7.5;8.0;9.0;10.0;12.0+PTX"

Capability = Tuple[int, int]

# How a user asks the README's commands for the CUDA kernels when no GPU is visible (they build
# none then: scripts/setup_env.sh); `info` prints it.
BUILD_CUDA_COMMAND = "PAGED_ATTN_BUILD_CUDA=1 bash scripts/setup_env.sh"

# GPUs people have, for `info` without a GPU and for the docs (name, compute capability).
COMMON_GPUS = (
    ("T4, RTX 20", (7, 5)),
    ("A100, A30", (8, 0)),
    ("A10, A40, RTX 30", (8, 6)),
    ("Jetson Orin", (8, 7)),
    ("L4, L40S, RTX 40", (8, 9)),
    ("H100, H200, GH200", (9, 0)),
    ("B200, GB200", (10, 0)),
    ("B300, GB300", (10, 3)),
    ("Jetson Thor", (11, 0)),
    ("RTX 50, RTX PRO 6000", (12, 0)),
    ("DGX Spark (GB10)", (12, 1)),
)


@dataclass(frozen=True)
class Target:
    """One compiled image: SASS (`sm_80`) or PTX (`compute_120`), variant '' | 'a' | 'f'."""

    major: int
    minor: int
    variant: str = ""
    ptx: bool = False

    @property
    def name(self) -> str:
        return f"{'compute' if self.ptx else 'sm'}_{self.major}{self.minor}{self.variant}"

    def runs_on(self, cap: Capability) -> bool:
        major, minor = cap
        if self.variant == "a":
            return (major, minor) == (self.major, self.minor)
        if self.variant == "f" or not self.ptx:
            return major == self.major and minor >= self.minor
        return (major, minor) >= (self.major, self.minor)


_TARGET_RE = re.compile(r"^(sm|compute)_(\d{2,4})([af]?)$")


def parse_target(name: str) -> Target:
    """'sm_80' / 'compute_120' / 'sm_90a' / 'compute_100f' -> Target. The last digit is the
    minor version (sm_120 = 12.0, sm_75 = 7.5), as in nvcc."""
    m = _TARGET_RE.match(name.strip())
    if not m:
        raise ValueError(f"not a CUDA arch target: {name!r} (expected e.g. sm_80 or compute_120)")
    digits = m.group(2)
    return Target(int(digits[:-1]), int(digits[-1]), m.group(3), m.group(1) == "compute")


def parse_targets(names) -> list:
    """A comma / space separated string or an iterable of names -> sorted unique Targets."""
    if isinstance(names, str):
        names = [n for n in re.split(r"[,\s]+", names) if n]
    found = {parse_target(n) for n in names}
    return sorted(found, key=lambda t: (t.major, t.minor, t.variant, t.ptx))


_GENCODE_RE = re.compile(r"arch=compute_(\d+[af]?),code=\[?\"?([^\"\]\s]+)")


def targets_from_gencode(flags: Iterable[str]) -> list:
    """nvcc flags ('-gencode=arch=compute_80,code=sm_80', '-gencode', 'arch=...,code=[sm_90,
    compute_90]') -> sorted target names ('sm_80', 'compute_90', ...)."""
    names = set()
    for flag in flags:
        for m in _GENCODE_RE.finditer(flag):
            for code in m.group(2).split(","):
                if code:
                    names.add(code)
    return [t.name for t in parse_targets(sorted(names))]


def _as_targets(targets) -> list:
    """A names string, or an iterable of names and / or Targets -> a list of Targets."""
    if isinstance(targets, str):
        return parse_targets(targets)
    return [t if isinstance(t, Target) else parse_target(t) for t in targets]


def capability_name(cap: Capability) -> str:
    return f"sm_{cap[0]}{cap[1]}"


@dataclass(frozen=True)
class Match:
    """Can a build with `targets` run on a GPU of capability `cap`, and from which image."""

    runs: bool
    target: Optional[str]  # the image the driver would pick: 'sm_80' or 'compute_120'
    how: str               # 'SASS', 'PTX (JIT-compiled by the driver at first use)' or ''


def match(cap: Capability, targets) -> Match:
    """The best image of `targets` (Targets or names) for capability `cap`: the newest
    compatible SASS, else the newest compatible PTX, else none."""
    ts = _as_targets(targets)
    sass = [t for t in ts if not t.ptx and t.runs_on(cap)]
    if sass:
        best = max(sass, key=lambda t: (t.major, t.minor, t.variant != ""))
        return Match(True, best.name, "SASS")
    ptx = [t for t in ts if t.ptx and t.runs_on(cap)]
    if ptx:
        best = max(ptx, key=lambda t: (t.major, t.minor, t.variant != ""))
        return Match(True, best.name, "PTX (JIT-compiled by the driver at first use)")
    return Match(False, None, "")


def rebuild_command(cap: Capability) -> str:
    """The command that rebuilds the extension for a GPU of capability `cap` (run in the
    paged_attention_ext checkout)."""
    return f"TORCH_CUDA_ARCH_LIST={cap[0]}.{cap[1]} pip install --no-build-isolation -e ."


def mismatch_message(cap: Capability, targets, device: str = "this GPU") -> str:
    """The error the CUDA ops raise on a GPU the build does not cover (the C++ twin,
    csrc/core/cuda_arch.h arch_error_message, writes the same text)."""
    names = [t.name for t in _as_targets(targets)]
    compiled = ", ".join(names) if names else "no CUDA archs"
    return (f"paged_attn: the CUDA kernels of this build cannot run on {device} "
            f"(compute capability {cap[0]}.{cap[1]}, {capability_name(cap)}): they were compiled "
            f"for {compiled}. Rebuild for this GPU in the paged_attention_ext checkout: "
            f"`{rebuild_command(cap)}` (a build with TORCH_CUDA_ARCH_LIST unset on a machine "
            f"with this GPU does the same), or set PAGED_ATTN_DISABLE_EXTENSION=1 to run the "
            f"PyTorch implementation instead.")


def resolve_arch_list(env: Optional[str], visible: Sequence[Capability],
                      max_supported: Optional[Capability] = None) -> Tuple[str, str]:
    """The TORCH_CUDA_ARCH_LIST to build for, and why.
    env: the user's TORCH_CUDA_ARCH_LIST (always wins when set and not 'native');
    visible: compute capabilities of the GPUs visible at build time;
    max_supported: the newest capability the toolchain targets (a newer GPU is built for this
    one, which runs on it through SASS of the same major or the PTX), as torch does."""
    if env is not None and env.strip() and env.strip() != "native":
        return env.strip(), "TORCH_CUDA_ARCH_LIST"
    caps = sorted({tuple(c) for c in visible})
    if caps:
        if max_supported is not None:
            caps = sorted({min(c, tuple(max_supported)) for c in caps})
        archs = [f"{c[0]}.{c[1]}" for c in caps]
        archs[-1] += "+PTX"
        return ";".join(archs), "the GPUs visible at build time"
    return DEFAULT_ARCH_LIST, "no GPU visible at build time: the default list"


def visible_capabilities():
    """(capabilities of the visible GPUs, newest capability torch's CUDA build targets)."""
    import torch  # only here: the module stays importable without torch

    if torch.version.cuda is None:
        return [], None
    caps = [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]
    sms = [int(re.sub(r"\D", "", a.split("_")[1])) for a in torch.cuda.get_arch_list()
           if a.startswith("sm_")]
    return caps, (max((s // 10, s % 10) for s in sms) if sms else None)


def resolve_build(env: Optional[str]):
    """What a build here compiles: (arch list, why, nvcc -gencode flags, image names). The flags
    are torch's own translation of the list (torch.utils.cpp_extension). setup.py and
    `main` use this; it imports torch and, when `env` does not decide, looks for GPUs."""
    import os

    from torch.utils import cpp_extension

    caps, newest = ([], None) if env and env.strip() not in ("", "native") \
        else visible_capabilities()
    archs, why = resolve_arch_list(env, caps, newest)
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs  # torch reads the list from the environment
    try:
        flags = cpp_extension._get_cuda_arch_flags()
    finally:
        if saved is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved
    return archs, why, flags, targets_from_gencode(flags)


# What else decides the device code and its size, from the environment of the build (setup.py
# and CMakeLists.txt both ask `device_code_flags`; docs/BUILD.md, "What a build holds"):
#   PAGED_ATTN_CUDA_BASELINE=1  the baseline kernel in the code for sm_80+ too (csrc/cuda/
#                               kernel_families.h); CI and the GPU check build it, as the reference
#                               PAGED_ATTN_CUDA_KERNEL=baseline runs;
#   PAGED_ATTN_CUDA_LINEINFO=1  -lineinfo: source lines for Nsight Compute (2.7x the SASS size);
# and the fatbinary is compressed for size wherever nvcc can (--compress-mode, nvcc >= 12.8: 4x
# smaller than nvcc's default compression, decompressed once when the library loads).
BASELINE_ENV = "PAGED_ATTN_CUDA_BASELINE"
LINEINFO_ENV = "PAGED_ATTN_CUDA_LINEINFO"


def nvcc_has_compress_mode(nvcc: str) -> bool:
    """Whether this nvcc takes --compress-mode (its --help lists it)."""
    import subprocess

    try:
        help_text = subprocess.run([nvcc, "--help"], capture_output=True, text=True,
                                   timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "--compress-mode" in help_text


def device_code_flags(env, compress_mode: bool) -> Tuple[list, list]:
    """(nvcc-only flags, defines for the host compiler and nvcc alike) for a build whose
    environment is `env` and whose nvcc takes --compress-mode or not."""
    nvcc = ["--compress-mode=size"] if compress_mode else []
    if env.get(LINEINFO_ENV) == "1":
        nvcc.append("-lineinfo")
    defines = ["-DPAGED_ATTN_CUDA_BASELINE"] if env.get(BASELINE_ENV) == "1" else []
    return nvcc, defines


def main(argv: Sequence[str]) -> int:
    """`python cuda_arch.py resolve` (CMakeLists.txt): prints the arch list a build here uses and,
    on a second line, its images colon-separated (the value of -DPAGED_ATTN_CUDA_ARCHS).
    `python cuda_arch.py flags NVCC`: device_code_flags for this environment, one line,
    space-separated."""
    import os

    if len(argv) == 2 and argv[0] == "flags":
        nvcc, defines = device_code_flags(os.environ, nvcc_has_compress_mode(argv[1]))
        print(" ".join(nvcc + defines))
        return 0
    if list(argv) != ["resolve"]:
        print("usage: python cuda_arch.py resolve | flags NVCC", file=sys.stderr)
        return 2

    archs, why, _, targets = resolve_build(os.environ.get("TORCH_CUDA_ARCH_LIST"))
    print(archs)
    print(":".join(targets))
    print(f"paged_attention_ext: CUDA archs {archs} ({why}) -> {', '.join(targets)}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
