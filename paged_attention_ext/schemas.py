"""The op schemas and the kv_cache_dtype names: THE lists, for both languages.

The Python side registers from it when the extension is absent; the build writes the same strings
into build/generated/paged_attn_schemas.inc (`write_cpp_includes`, called by setup.py and CMake),
which csrc/ops.cpp defines with TORCH_LIBRARY, and the kv_cache_dtype names into
build/generated/paged_attn_kv_cache_dtypes.inc, which csrc/torch_glue/validate.cpp parses with. tests/test_registry.py checks a loaded extension
holds them (a stale build would not). Each op has a `.scale_tensor` overload (k_scale /
v_scale as 1-element float32 tensors, read on the device: no host sync) and a default overload
(Python floats). ORDER MATTERS: torch.ops overload resolution takes the first schema that
matches, and a 0-dim tensor given to a `float` argument silently converts through __float__
(a host sync), so the tensor overload is listed, and registered, first. torch's own
resolution would then make a call with float scales through the packet first fail to match the
tensor overload (a one-token v1: 27.7 us, against 9.0 us through `.default`), so each packet
resolves from the scales' types instead (_registration.py; docs/DESIGN.md).
"""

LIBRARY = "paged_attn"
TENSOR_SCALES_OVERLOAD = "scale_tensor"  # each op's overload with k_scale / v_scale tensors

# Arguments shared by v1 and v2 after their outputs.
_ATTN_ARGS = (
    "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, float scale, "
    "Tensor block_tables, Tensor seq_lens, int block_size, int max_seq_len, Tensor? alibi_slopes"
)
_BLOCKSPARSE_ARGS = (
    "int tp_rank=0, int blocksparse_local_blocks=0, int blocksparse_vert_stride=0, "
    "int blocksparse_block_size=64, int blocksparse_head_sliding_step=0"
)
_SCALES_TENSOR = "str kv_cache_dtype, Tensor k_scale, Tensor v_scale"
_SCALES_FLOAT = 'str kv_cache_dtype="auto", float k_scale=1.0, float v_scale=1.0'

_V1_OUT = "Tensor(a!) out"
_V2_OUT = "Tensor(a!) out, Tensor(b!) exp_sums, Tensor(c!) max_logits, Tensor(d!) tmp_out"
_CACHE_ARGS = (
    "Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping"
)
# decode: caches in NHD dimension order [num_blocks, block_size, num_kv_heads, head_size], any
# strides with a contiguous last dim (an HND cache is passed as its transposed view); sizes come
# from the tensors, the partitioning is internal (CONTRACT.md, "NHD / HND caches").
_DECODE_ARGS = (
    "Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, "
    "Tensor seq_lens, float scale, Tensor? alibi_slopes"
)

# (name with overload, schema after the name), in registration order.
_T = TENSOR_SCALES_OVERLOAD
SCHEMAS = (
    (f"v1.{_T}", f"({_V1_OUT}, {_ATTN_ARGS}, {_SCALES_TENSOR}, {_BLOCKSPARSE_ARGS}) -> ()"),
    ("v1", f"({_V1_OUT}, {_ATTN_ARGS}, {_SCALES_FLOAT}, {_BLOCKSPARSE_ARGS}) -> ()"),
    (f"v2.{_T}", f"({_V2_OUT}, {_ATTN_ARGS}, {_SCALES_TENSOR}, {_BLOCKSPARSE_ARGS}) -> ()"),
    ("v2", f"({_V2_OUT}, {_ATTN_ARGS}, {_SCALES_FLOAT}, {_BLOCKSPARSE_ARGS}) -> ()"),
    (f"reshape_and_cache.{_T}", f"({_CACHE_ARGS}, {_SCALES_TENSOR}) -> ()"),
    ("reshape_and_cache", f"({_CACHE_ARGS}, {_SCALES_FLOAT}) -> ()"),
    (f"decode.{_T}", f"({_DECODE_ARGS}, {_SCALES_TENSOR}) -> ()"),
    ("decode", f"({_DECODE_ARGS}, {_SCALES_FLOAT}) -> ()"),
    (f"reshape_and_cache_flash.{_T}", f"({_CACHE_ARGS}, {_SCALES_TENSOR}) -> ()"),
    ("reshape_and_cache_flash", f"({_CACHE_ARGS}, {_SCALES_FLOAT}) -> ()"),
)


# kv_cache_dtype (the ops' string argument) -> cache kind: "auto" (the cache holds the query
# dtype) or an fp8 format (the cache holds its uint8 bytes). core.cache_kind and the C++
# validation (parse_kv_cache_dtype) both read this table. "float16" / "bfloat16": vLLM's
# --kv-cache-dtype values for an unquantized cache reach its kernels as these strings, which
# read them as "auto" (the cache holds the model dtype); so do we.
KV_CACHE_DTYPES = {"auto": "auto", "float16": "auto", "bfloat16": "auto", "fp8": "fp8_e4m3",
                   "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# cache kind -> its C++ enumerator (CacheKind, csrc/core/params.h)
CACHE_KIND_ENUMERATORS = {"auto": "kAuto", "fp8_e4m3": "kFp8E4M3", "fp8_e5m2": "kFp8E5M2"}

# The ops' names, each once, in registration order: what detection, `info` and `check` cover.
OP_NAMES = tuple(dict.fromkeys(name.partition(".")[0] for name, _ in SCHEMAS))


def full_schemas():
    """'name.overload(args) -> ()' strings as TORCH_LIBRARY m.def takes them."""
    return [name + sig for name, sig in SCHEMAS]


def cpp_include() -> str:
    """The schemas as C++ string literals, one per line, for csrc/ops.cpp's array."""
    lines = ["// Generated from paged_attention_ext/schemas.py by the build: do not edit."]
    for schema in full_schemas():
        escaped = schema.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'"{escaped}",')
    return "\n".join(lines) + "\n"


def kv_cache_dtypes_include() -> str:
    """KV_CACHE_DTYPES as X-macro lines PAGED_ATTN_KV_CACHE_DTYPE(name, enumerator, kind)."""
    lines = ["// Generated from paged_attention_ext/schemas.py by the build: do not edit."]
    for name, kind in KV_CACHE_DTYPES.items():
        lines.append(f'PAGED_ATTN_KV_CACHE_DTYPE("{name}", {CACHE_KIND_ENUMERATORS[kind]}, "{kind}")')
    return "\n".join(lines) + "\n"


def write_cpp_includes(out_dir: str) -> None:
    """Writes paged_attn_schemas.inc (cpp_include()) and paged_attn_kv_cache_dtypes.inc
    (kv_cache_dtypes_include()) into out_dir, each only when its content changes (no needless
    rebuild)."""
    import os

    os.makedirs(out_dir, exist_ok=True)
    for name, text in (("paged_attn_schemas.inc", cpp_include()),
                       ("paged_attn_kv_cache_dtypes.inc", kv_cache_dtypes_include())):
        path = os.path.join(out_dir, name)
        try:
            with open(path) as f:
                if f.read() == text:
                    continue
        except OSError:
            pass
        with open(path, "w") as f:
            f.write(text)


if __name__ == "__main__":  # python paged_attention_ext/schemas.py OUT_DIR (CMake)
    import sys

    write_cpp_includes(sys.argv[1])
