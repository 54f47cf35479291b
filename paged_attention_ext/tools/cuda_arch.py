"""Which NVIDIA GPU archs a build's CUDA kernels run on: compiled images (sm_80, compute_120, ...)
against a GPU's compute capability.

Pure functions: no torch import, no CUDA call. Used by
  - `python -m paged_attention_ext info`: can our kernels run on each visible GPU (`match`);
  - build_helpers/cuda_build.py (loaded by path): which images a build's -gencode flags make;
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
from dataclasses import dataclass
from typing import Optional, Tuple

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
