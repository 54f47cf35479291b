"""Shared pytest setup: the `slow` and `backends` markers, tests/ on sys.path (for the helpers of
tests/support), the fixture that hands out the registered torch.ops.paged_attn ops, the `backend`
fixture (one param per backend of this build: tests/support/backend_params.py) and the fallback's
chunkings."""

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
    config.addinivalue_line("markers", "backends(cpu_variants=True, chunkings=False, "
                            "slow_off_gpu=False, cuda=True): which params the `backend` fixture "
                            "gives the test (tests/support/backend_params.py params())")


def pytest_generate_tests(metafunc):
    """A test taking `backend` runs once per backend of this build (backend_params.params, with
    the test's `backends` marker as its arguments), unless the test parametrizes `backend`
    itself (a plain argument of its own)."""
    def names(mark):
        argnames = mark.args[0]
        return argnames if isinstance(argnames, (list, tuple)) else argnames.replace(" ", "").split(",")

    own = any("backend" in names(m) for m in metafunc.definition.iter_markers("parametrize"))
    if "backend" in metafunc.fixturenames and not own:
        from support import backend_params

        marker = metafunc.definition.get_closest_marker("backends")
        metafunc.parametrize("backend", backend_params.params(**(marker.kwargs if marker else {})),
                             indirect=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """item.passed_call: whether the test itself passed (read by fixtures at teardown)."""
    report = (yield).get_result()
    if report.when == "call":
        item.passed_call = report.passed


@pytest.fixture
def backend(request, monkeypatch):
    """The backend request.param names (backend_params.Param), made the one that runs: a
    backend_params.Backend. Skipped where this machine cannot run it; a CUDA kernel choice is
    proven afterwards to have been the kernel that ran."""
    from support import backend_params

    with backend_params.activate(request.param, monkeypatch,
                                 lambda: getattr(request.node, "passed_call", False)) as active:
        yield active


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


# The fallback's chunkings (support/backend_params.py CHUNKINGS), for the tests of the PyTorch
# implementation outside tests/test_conformance.py.
CHUNKINGS = ("default", "tiny", "one_pass", "one_chunk")


@pytest.fixture(params=CHUNKINGS)
def chunking(request, monkeypatch):
    from paged_attention_ext import fallback
    from support.backend_params import CHUNKINGS as SIZES

    if SIZES[request.param] is not None:
        chunk_bytes, pass_logit_bytes = SIZES[request.param]
        monkeypatch.setattr(fallback, "CHUNK_BYTES", chunk_bytes)
        monkeypatch.setattr(fallback, "PASS_LOGIT_BYTES", pass_logit_bytes)
    return request.param
