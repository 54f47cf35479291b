#!/usr/bin/env bash
# copy_tree.sh DEST — the sources a build and its tests need, copied from this checkout into DEST
# (no built _C, no caches), for the CI steps that build in a tree of their own (test_clang.sh,
# cuda_build.sh) and so leave the main build untouched.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:?usage: copy_tree.sh DEST}"
mkdir -p "$DEST"
tar -C "$ROOT" -c --exclude='_C*.so' --exclude=__pycache__ \
  build_helpers csrc docs paged_attention_ext scripts tests setup.py pyproject.toml README.md LICENSE \
  | tar -C "$DEST" -x
