#!/usr/bin/env bash
# The README's path on a machine without nvcc, run on any machine: scripts/test.sh in a copy of the
# tree (build/no-nvcc) with nvcc hidden from PATH and no torch chosen, so setup_env.sh creates the
# copy's own .venv, installs its default CPU torch and builds _C CPU-only. The main build and
# .venv are untouched. Extra arguments go to pytest (default: the core tests below, not @slow).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COPY="$ROOT/build/no-nvcc"
mkdir -p "$COPY"
tar -C "$ROOT" -c --exclude='_C*.so' --exclude=__pycache__ \
  csrc docs paged_attention_ext scripts tests setup.py pyproject.toml README.md | tar -C "$COPY" -x

NO_NVCC_PATH="$(tr ':' '\n' <<<"$PATH" | while read -r d; do [[ -x "$d/nvcc" ]] || echo "$d"; done \
                | paste -sd:)"
if [[ $# -eq 0 ]]; then
  set -- tests/test_reference.py tests/test_fallback.py tests/test_bad_input.py \
         tests/test_registry.py tests/test_opcheck_compile.py tests/test_extension_load.py \
         tests/test_cpu_kernel.py tests/test_cpu_kernel_choice.py tests/test_cpu_isa_isolation.py \
         -m "not slow"
fi
cd "$COPY"
run() {  # in the copy, as on a machine without nvcc and without a torch of its own
  env -u VIRTUAL_ENV -u CONDA_PREFIX -u PAGED_ATTN_PYTHON -u PAGED_ATTN_TORCH \
      -u PAGED_ATTN_BUILD_CUDA -u PAGED_ATTN_BUILD_LOG -u PAGED_ATTN_PTXAS_VERBOSE \
      -u TORCH_CUDA_ARCH_LIST PATH="$NO_NVCC_PATH" "$@"
}
run bash scripts/setup_env.sh >/dev/null
# What this run claims: a CPU build of torch and a CPU-only _C, loaded.
.venv/bin/python -c "
import torch, paged_attention_ext as pa
from paged_attention_ext.tools import backends
assert torch.version.cuda is None, f'torch {torch.__version__} is a CUDA build'
assert pa.extension_loaded(), pa.extension_status()
assert backends.compiled_kernel('v2', 'CPU') and not backends.compiled_kernel('v2', 'CUDA')
print(f'[no-nvcc] torch {torch.__version__} (CPU build), extension _C {pa.extension_status()}')"
PAGED_ATTN_REQUIRE_EXTENSION=1 run bash scripts/test.sh "$@"
