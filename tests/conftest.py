"""Shared pytest setup: the `slow` marker, tests/ on sys.path (for dense_reference), and the
fixture that hands out the registered torch.ops.paged_attn ops (or skips when they are not)."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    # Also declared in pyproject.toml; repeated here so the suite runs from any rootdir.
    config.addinivalue_line("markers", "slow: long-running tests (deselect with -m 'not slow')")


def registered_ops():
    """torch.ops.paged_attn after `import paged_attention_ext`, or None with the reason."""
    try:
        import paged_attention_ext  # noqa: F401  (registers the ops)
    except Exception as error:  # the package __init__ may not be wired yet
        return None, f"import paged_attention_ext failed: {error!r}"
    try:
        torch.ops.paged_attn.v2  # noqa: B018
    except (AttributeError, RuntimeError):
        return None, "torch.ops.paged_attn.v2 is not registered by paged_attention_ext"
    return torch.ops.paged_attn, None


@pytest.fixture
def paged_ops():
    ops, reason = registered_ops()
    if ops is None:
        pytest.skip(reason)
    return ops
