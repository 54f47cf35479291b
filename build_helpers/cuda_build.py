"""What a build's CUDA device code is: the arch list (TORCH_CUDA_ARCH_LIST, else the GPUs visible
at build time, else DEFAULT_ARCH_LIST), nvcc's -gencode flags for it, and the flags the build's
environment adds (compression, -lineinfo, the baseline kernel). A build helper, not part of the
installed package:
  - setup.py loads this file by path (importing the package could load a stale _C);
  - CMakeLists.txt runs it: `python build_helpers/cuda_build.py resolve | flags NVCC`;
  - tests/test_cuda_arch.py and tests/test_build_info.py check it.
Which GPU runs which image is paged_attention_ext/tools/cuda_arch.py's (loaded by path here too).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from typing import Iterable, Optional, Sequence, Tuple


def _load_cuda_arch():
    """paged_attention_ext/tools/cuda_arch.py by path (no package import, no torch)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                        "paged_attention_ext", "tools", "cuda_arch.py")
    spec = importlib.util.spec_from_file_location("_paged_attn_cuda_arch", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


cuda_arch = _load_cuda_arch()
Capability = cuda_arch.Capability

# The list built when TORCH_CUDA_ARCH_LIST is unset and no GPU is visible at build time
# (docs/BUILD.md: why these, and what they cost). SASS for T4 (7.5), A100 (8.0; also runs on
# 8.6 / 8.7 / 8.9: A10, RTX 30, Orin, L4, RTX 40), H100/H200 (9.0), B200/GB200 (10.0; also 10.3),
# RTX 50 / RTX PRO (12.0; also 12.1), and PTX of 12.0 for GPUs newer than 12.0.
# NOTE: keep in sync with nothing else: CMakeLists.txt and setup.py read it from here.
DEFAULT_ARCH_LIST = "7.5;8.0;9.0;10.0;12.0+PTX"



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
    return [t.name for t in cuda_arch.parse_targets(sorted(names))]


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
    """`python cuda_build.py resolve` (CMakeLists.txt): prints the arch list a build here uses and,
    on a second line, its images colon-separated (the value of -DPAGED_ATTN_CUDA_ARCHS).
    `python cuda_build.py flags NVCC`: device_code_flags for this environment, one line,
    space-separated."""
    import os

    if len(argv) == 2 and argv[0] == "flags":
        nvcc, defines = device_code_flags(os.environ, nvcc_has_compress_mode(argv[1]))
        print(" ".join(nvcc + defines))
        return 0
    if list(argv) != ["resolve"]:
        print("usage: python cuda_build.py resolve | flags NVCC", file=sys.stderr)
        return 2

    archs, why, _, targets = resolve_build(os.environ.get("TORCH_CUDA_ARCH_LIST"))
    print(archs)
    print(":".join(targets))
    print(f"paged_attention_ext: CUDA archs {archs} ({why}) -> {', '.join(targets)}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
