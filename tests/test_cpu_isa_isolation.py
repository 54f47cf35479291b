"""No code built for a newer ISA can run before the run-time check: in the compiled extension,
every function that touches a 256- or 512-bit register belongs to an ISA file's namespace
(avx2::, avx512::, avx512_bf16::, amx::), which only runs after its cpu_supports() said yes. A standard
library inline function compiled inside an ISA region would show up here (the linker may keep
that copy for baseline callers: SIGILL on an older CPU)."""

import os
import re
import shutil
import subprocess

import pytest

import paged_attention_ext as pa

pytestmark = [
    pytest.mark.skipif(not pa.extension_loaded(),
                       reason=f"compiled extension: {pa.extension_status()}"),
    pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 registers"),
    pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) not installed"),
]

ISA_NAMESPACES = ("paged_attn::cpu::avx2::", "paged_attn::cpu::avx512::",
                  "paged_attn::cpu::avx512_bf16::", "paged_attn::cpu::amx::")


def _functions_using_wide_registers(path: str) -> set:
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", path], check=True,
                          capture_output=True, text=True).stdout
    found, current = set(), None
    for line in dump.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if header:
            current = header.group(1)
        elif current and re.search(r"%[yz]mm\d", line):
            found.add(current)
    return found


def test_wide_registers_only_inside_isa_namespaces():
    so = pa._C.__file__
    wide = _functions_using_wide_registers(so)
    ours = {f for f in wide if "paged_attn" in f}
    assert ours, "no AVX code found at all: the SIMD variants are missing from the build"
    outside = sorted(f for f in wide if not any(ns in f for ns in ISA_NAMESPACES))
    assert not outside, f"AVX code outside the ISA files' namespaces: {outside[:10]}"
