"""The CUDA images (sm_XX SASS, compute_XX PTX) a shared library really holds, read from its
fatbinaries: the evidence the tests hold build_info()'s arch list against (the build reports the
list it passed to nvcc; this reads what nvcc wrote)."""

import struct

from paged_attention_ext.tools.cuda_arch import parse_targets

# A CUDA fatbinary starts with magic 0xBA55ED50 (u32), version (u16), header size (u16),
# payload size (u64). Each entry then has: kind (u16: 1 PTX, 2 ELF cubin), version (u16),
# header size (u32), padded payload size (u64), ..., the SM number (u32) at byte 28.
_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)


def fatbin_archs(blob: bytes) -> list:
    """The 'sm_XX' (cubin) and 'compute_XX' (PTX) names found in a shared library's fatbins, in
    the order build_info() lists a build's images (cuda_arch.parse_targets: by arch, SASS before
    PTX of the same arch)."""
    found = set()
    start = blob.find(_FATBIN_MAGIC)
    while start != -1:
        try:
            _, _, header_size, fat_size = struct.unpack_from("<IHHQ", blob, start)
            pos, end = start + header_size, start + header_size + fat_size
            while pos + 32 <= min(end, len(blob)):
                kind, _, entry_header, padded = struct.unpack_from("<HHIQ", blob, pos)
                sm = struct.unpack_from("<I", blob, pos + 28)[0]
                if kind not in (1, 2) or entry_header == 0 or not 10 <= sm < 1000:
                    break
                found.add(("sm_" if kind == 2 else "compute_") + str(sm))
                pos += entry_header + padded
        except struct.error:
            pass
        start = blob.find(_FATBIN_MAGIC, start + 4)
    return [t.name for t in parse_targets(found)]


def library_archs(path: str) -> list:
    with open(path, "rb") as f:
        return fatbin_archs(f.read())
