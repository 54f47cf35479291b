"""The build's link flag for the C++ standard library: link the extension against the shared
libstdc++ (`-l:libstdc++.so.6`) that torch itself uses, whenever the compiler can find it.

Why: some GCC installs put a static libstdc++ (or a linker script that adds static parts) first
in their own library folder. The NVIDIA H200 machine's GCC 13 (a wrapper adding `-B/opt/gcc/...`)
did: the extension got its own copy of parts of libstdc++ (std::ostream::_M_insert<long> among
them), and with Python's `-Wl,-Bsymbolic-functions` our code called that copy while the stream
objects were set up by the shared library torch loaded. The first error message that printed a
number crashed the process (SIGSEGV) instead of raising. Naming the shared library before the
compiler's own `-lstdc++` makes the linker take every symbol it has from there; anything only
the compiler's library has still comes from it. tests/test_extension_load.py checks the result.

Linux only; where the compiler cannot find libstdc++.so.6 (or is not GCC-like) nothing is added.
setup.py loads this file by path, CMakeLists.txt runs it (`python libstdcxx_flags.py CXX`).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

SHARED_LIBSTDCXX = "libstdc++.so.6"


def libstdcxx_link_flags(cxx: str, platform: str = sys.platform) -> list:
    """['-l:libstdc++.so.6'] when `cxx` (a command line, as in $CXX) finds that file, else []."""
    if not platform.startswith("linux"):
        return []
    try:
        found = subprocess.run([*shlex.split(cxx), f"-print-file-name={SHARED_LIBSTDCXX}"],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    # A compiler that cannot find the file prints the bare name back.
    return [f"-l:{SHARED_LIBSTDCXX}"] if os.path.isabs(found) and os.path.exists(found) else []


if __name__ == "__main__":
    print(" ".join(libstdcxx_link_flags(sys.argv[1] if len(sys.argv) > 1 else "c++")))
