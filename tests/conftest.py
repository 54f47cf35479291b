"""Shared pytest setup: the `slow` marker, tests/ on sys.path (for dense_reference), and the
fixture that hands out the registered torch.ops.paged_attn ops."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    # Also declared in pyproject.toml; repeated here so the suite runs from any rootdir.
    config.addinivalue_line("markers", "slow: long-running tests (deselect with -m 'not slow')")


def registered_ops():
    """torch.ops.paged_attn after `import paged_attention_ext`. A failing import (e.g.
    PAGED_ATTN_REQUIRE_EXTENSION=1 with a `_C` that does not load) or missing ops fail the test:
    neither is a reason to skip."""
    import paged_attention_ext  # noqa: F401  (registers the ops)

    assert hasattr(torch.ops.paged_attn, "v2"), "paged_attention_ext did not register the ops"
    return torch.ops.paged_attn


@pytest.fixture
def paged_ops():
    return registered_ops()
