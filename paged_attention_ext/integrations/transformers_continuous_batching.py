"""transformers' continuous batching (`generate_batch`, `ContinuousBatchingManager`, what
`transformers serve` runs) decoding through this project's ops, with unchanged user code:

    from paged_attention_ext.integrations.transformers import CONTINUOUS_BATCHING
    model.set_attn_implementation(CONTINUOUS_BATCHING)
    model.generate_batch(prompts, generation_config=...)

What transformers does with it (transformers 5.24; file locations in docs/INTEGRATIONS.md):
  - continuous batching accepts "paged|eager", "sdpa" or a name containing "flash"
    (ContinuousBatchingManager.switch_to_cb_friendly_attn). A "flash" implementation is
    transformers' own `flash_attention_forward` driving FlashAttention's Python API, which it
    loads per name (modeling_flash_attention_utils._lazy_imports: the flash-attn packages, else
    a kernels-hub repository downloaded with the `kernels` library).
  - decode-only batches take the block-table path: PagedAttentionCache.update leaves the cache
    alone and hands the attention the page-table views of its cache buffer (k_cache, v_cache
    [num_pages, page_size, num_kv_heads, head_size]) and the block table; the attention writes
    the new token and attends (`flash_attn_with_kvcache`). Prefill and mixed batches take the
    varlen path: the cache writes and gathers K/V itself, the attention gets packed sequences
    (`flash_attn_varlen_func`).

What this module adds, once, on import (nothing in transformers' files is edited):
  1. CONTINUOUS_BATCHING is registered with transformers' AttentionInterface (as
     `flash_attention_forward`, exactly as transformers registers a hub kernel) and its mask
     function with AttentionMaskInterface (the flash one), both public registries.
  2. transformers' flash loader resolves CONTINUOUS_BATCHING to `transformers_flash` (this
     package's FlashAttention API over the paged ops) instead of looking for a hub repository:
     the one kernel loader of transformers 5.24 only downloads (no local path for attention
     kernels), so this is a local kernel without a download.
  3. the decode block-table path is enabled for CONTINUOUS_BATCHING on every device: transformers
     5.24 enables it only for FlashAttention 2/3 on CUDA or XPU
     (initialization.ensure_decode_fast_path_is_available), i.e. never on a CPU. Models with a
     sliding-window layer keep transformers' own refusal of that path. Accelerator graphs stay
     off unless the config asks for them (`use_cuda_graph`): transformers turns them on by
     default for a flash implementation, and flash_attn_varlen_func reads its sequence bounds on
     the host, which a graph capture forbids.
Hooks 2 and 3 wrap one private function each; they are installed only on the transformers
versions listed in SUPPORTED_TRANSFORMERS and pass every other implementation through unchanged.
"""

import functools
import warnings

import transformers
from packaging.version import Version

from . import transformers_flash

CONTINUOUS_BATCHING = "paged_attn_flash"

# The transformers releases whose internals hooks 2 and 3 are written against (pyproject.toml's
# `transformers-continuous-batching` extra and docs/INTEGRATIONS.md state the same range).
SUPPORTED_TRANSFORMERS = (Version("5.24"), Version("5.25"))  # [low, high)

__all__ = ["CONTINUOUS_BATCHING", "SUPPORTED_TRANSFORMERS", "is_supported", "register"]


def is_supported(version: str = transformers.__version__) -> bool:
    low, high = SUPPORTED_TRANSFORMERS
    return low <= Version(Version(version).base_version) < high


def _install_flash_loader() -> None:
    """Hook 2: transformers' flash loader returns this package's API for CONTINUOUS_BATCHING."""
    from transformers import modeling_flash_attention_utils as fa_utils

    original = fa_utils._lazy_imports
    if getattr(original, "_paged_attention_ext", False):
        return

    @functools.wraps(original)
    def lazy_imports(implementation, attention_wrapper=None, allow_all_kernels=False):
        if implementation == CONTINUOUS_BATCHING:  # what the loader returns for a flash kernel
            return (transformers_flash.flash_attn_func, transformers_flash.flash_attn_varlen_func,
                    transformers_flash.flash_attn_with_kvcache, fa_utils._pad_input,
                    fa_utils._unpad_input)
        return original(implementation, attention_wrapper, allow_all_kernels=allow_all_kernels)

    lazy_imports._paged_attention_ext = True
    fa_utils._lazy_imports = lazy_imports


def _install_decode_path() -> None:
    """Hook 3: the block-table decode path for CONTINUOUS_BATCHING on any device, graphs off
    unless asked for."""
    from transformers.generation.continuous_batching import initialization
    from transformers.generation.continuous_batching.cache import (
        ATTN_TYPE_TO_ALLOCATOR, group_layers_by_attn_type)

    original = initialization.ensure_decode_fast_path_is_available
    if getattr(original, "_paged_attention_ext", False):
        return

    @functools.wraps(original)
    def ensure_decode_fast_path_is_available(config, cb_config, user_requested):
        if config._attn_implementation != CONTINUOUS_BATCHING:
            return original(config, cb_config, user_requested)
        # transformers' own rule, minus the device test: every layer type must support it.
        layer_types = group_layers_by_attn_type(config)
        if not all(ATTN_TYPE_TO_ALLOCATOR[t].supports_block_table for t in layer_types):
            cb_config.max_blocks_per_request = 0
        if cb_config.use_cuda_graph is None:  # transformers' default would be on (see above)
            cb_config.use_cuda_graph = (False, False)
        return None

    ensure_decode_fast_path_is_available._paged_attention_ext = True
    initialization.ensure_decode_fast_path_is_available = ensure_decode_fast_path_is_available


def register() -> bool:
    """Install CONTINUOUS_BATCHING (idempotent; done on import). Returns False, with a
    warning, on a transformers version outside SUPPORTED_TRANSFORMERS (nothing installed)."""
    if not is_supported():
        low, high = SUPPORTED_TRANSFORMERS
        warnings.warn(f"paged_attention_ext: CONTINUOUS_BATCHING ({CONTINUOUS_BATCHING!r}) needs "
                      f"transformers>={low},<{high}; found {transformers.__version__}, so it is "
                      f"not registered", stacklevel=2)
        return False
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.flash_attention import flash_attention_forward

    _install_flash_loader()
    _install_decode_path()
    AttentionInterface.register(CONTINUOUS_BATCHING, flash_attention_forward)
    AttentionMaskInterface.register(CONTINUOUS_BATCHING,
                                    AttentionMaskInterface()["flash_attention_2"])
    return True


register()
