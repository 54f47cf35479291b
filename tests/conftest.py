"""Shared pytest setup: the `slow` marker, tests/ on sys.path (for the helpers of tests/support),
the fixture that hands out the registered torch.ops.paged_attn ops and the fallback's chunkings."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# pytest-xdist's workers set COLUMNS=80 (a user's narrow terminal to the CLI, which then folds its
# tables); the tests read the CLI's output as it is written to a file or pipe.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_configure(config):
    # Also declared in pyproject.toml; repeated here so the suite runs from any rootdir.
    config.addinivalue_line("markers", "slow: not in the default test command (scripts/test.sh): "
                            "long runs and the builds of separate programs; --all runs them too")


def pytest_terminal_summary(terminalreporter):
    """Says at the end of every run which compiled CPU kernel variants this machine executes and
    which it cannot (their tests skip, e.g. AVX-512 on an AVX2-only CPU), so that a green run
    is never read as covering a variant it could not execute."""
    try:
        import paged_attention_ext as pa

        variants = pa.cpu_kernel_variants()
    except Exception as exc:  # the tests themselves report a failing import
        terminalreporter.write_line(f"CPU kernel variants: unknown ({type(exc).__name__})")
        return
    if not variants:
        terminalreporter.write_line("CPU kernel variants: none (compiled extension not loaded)")
        return
    ran = [name for name, runnable, _ in variants if runnable]
    not_ran = [f"{name} ({note})" for name, runnable, note in variants if not runnable]
    terminalreporter.write_line("CPU kernel variants this machine executes: " + ", ".join(ran))
    if not_ran:
        terminalreporter.write_line("CPU kernel variants it CANNOT execute (their tests skip): "
                                    + ", ".join(not_ran))


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


# The fallback's chunkings (paged_attention_ext/fallback.py CHUNK_BYTES, PASS_LOGIT_BYTES), for the
# tests of the PyTorch implementation: (CHUNK_BYTES, PASS_LOGIT_BYTES) of one partition of one row
# per sub-chunk and per pass; the same sub-chunks, all in one pass; everything in one sub-chunk
# and one pass.
CHUNKINGS = {"default": None, "tiny": (1, 1), "one_pass": (1, 1 << 40),
             "one_chunk": (1 << 40, 1 << 40)}


@pytest.fixture(params=list(CHUNKINGS), ids=list(CHUNKINGS))
def chunking(request, monkeypatch):
    from paged_attention_ext import fallback

    if CHUNKINGS[request.param] is not None:
        chunk_bytes, pass_logit_bytes = CHUNKINGS[request.param]
        monkeypatch.setattr(fallback, "CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(fallback, "PASS_LOGIT_BYTES", pass_logit_bytes)
    return request.param
