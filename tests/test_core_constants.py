"""The contract's constants, owned in Python by paged_attention_ext.core, held against their C++
owner (csrc/core/params.h, read as text: the build does not report them) and against vLLM's
definitions written out here."""

import re
from pathlib import Path

import pytest
import torch

import paged_attention_ext as pa
from paged_attention_ext import core, schemas

PARAMS_H = Path(__file__).resolve().parents[1] / "csrc" / "core" / "params.h"


def test_partition_size_is_params_h_kpartitionsize():
    found = re.findall(r"constexpr\s+int\s+kPartitionSize\s*=\s*(\d+)\s*;", PARAMS_H.read_text())
    assert found == [str(core.PARTITION_SIZE)]
    assert pa.PARTITION_SIZE == core.PARTITION_SIZE  # the package's public name is core's


def test_cache_kinds_are_params_h_cachekind():
    # params.h: enum class CacheKind { kAuto, kFp8E4M3 ("fp8", "fp8_e4m3"), kFp8E5M2 ("fp8_e5m2") }
    text = PARAMS_H.read_text()
    body = re.search(r"enum class CacheKind\s*:\s*int\s*\{(.*?)\};", text, re.S).group(1)
    kinds = re.findall(r"k(Auto|Fp8E4M3|Fp8E5M2)\s*=", body)
    assert kinds == ["Auto", "Fp8E4M3", "Fp8E5M2"]
    # every enumerator has exactly one kind name in the table the C++ validation is built from
    enumerators = re.findall(r"\b(k\w+)\s*=", body)
    assert sorted(schemas.CACHE_KIND_ENUMERATORS.values()) == sorted(enumerators)
    assert set(schemas.CACHE_KIND_ENUMERATORS) == set(core.KV_CACHE_DTYPES.values())
    assert core.KV_CACHE_DTYPES is schemas.KV_CACHE_DTYPES  # one table for Python and C++
    assert sorted(set(core.KV_CACHE_DTYPES.values())) == ["auto", "fp8_e4m3", "fp8_e5m2"]
    # vLLM's strings: "fp8" is e4m3; "float16" / "bfloat16" an unquantized cache ("auto")
    assert core.KV_CACHE_DTYPES == {"auto": "auto", "float16": "auto", "bfloat16": "auto",
                                    "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3",
                                    "fp8_e5m2": "fp8_e5m2"}
    assert core.FP8_DTYPES == {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


@pytest.mark.parametrize("dtype,x", [(torch.float32, 4), (torch.float16, 8), (torch.bfloat16, 8),
                                     (torch.uint8, 16)])
def test_key_chunk_elements_is_16_bytes(dtype, x):
    assert core.key_chunk_elements(dtype) == x


def test_cache_kind_and_storage():
    assert core.cache_kind("fp8", "here") == "fp8_e4m3"
    assert core.cache_storage_dtype("auto", torch.bfloat16) == torch.bfloat16
    assert core.cache_storage_dtype("fp8_e5m2", torch.bfloat16) == torch.uint8
    for bad in ("fp16", "FP8", None, 8):
        with pytest.raises(ValueError, match=r"^here: unknown kv_cache_dtype .* \(expected 'auto', "
                                             r"'float16', 'bfloat16', 'fp8', 'fp8_e4m3' or "
                                             r"'fp8_e5m2'\)$"):
            core.cache_kind(bad, "here")
