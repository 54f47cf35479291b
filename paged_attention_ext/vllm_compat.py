"""Former home of `paged_attention_ext.integrations.vllm_compat`, kept importable: this name is
that module itself (same object), not a copy."""

import sys

from .integrations import vllm_compat as _vllm_compat

sys.modules[__name__] = _vllm_compat
