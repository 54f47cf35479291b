"""`check`: run every active backend's ops (v1, v2, reshape_and_cache on vLLM's layout; decode and
reshape_and_cache_flash on an NHD-ordered cache, NHD / HND / combined by turns) on a few fresh
random shapes against the oracle (paged_attention_ext.reference), and each backend's fp8 decode on
every byte of both formats (conformance.every_fp8_byte); report max errors, pass/fail.
The cases and the comparison are tools/conformance.py's, the one harness the tests use too.

Inputs come from paged_attention_ext.tools.testing: N(0,1) q/k/v (sharp softmax), shuffled block
tables with garbage past each row, NaN in every unused cache slot, outputs pre-filled with NaN.
The shapes are drawn from a seed that is printed, so a failure can be replayed with --seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Optional

import paged_attention_ext

from . import conformance
from .backends import Backend, active_backends


@dataclass
class CaseResult:
    backend: str
    op: str
    case: str
    max_abs_err: float
    passed: bool
    message: str = ""


def _result(backend: Backend, case: str, outcome: conformance.Outcome) -> CaseResult:
    message = outcome.message.splitlines()[0] if outcome.message else ""
    return CaseResult(backend.name, outcome.op, case, outcome.max_abs_err, outcome.passed,
                      message)


def _check_v1(backend: Backend, case: conformance.CaseSpec, seed: int) -> CaseResult:
    inputs = conformance.case_inputs(case, backend.device, seed)
    return _result(backend, case.label, conformance.v1(backend.ops, inputs))


def _check_v2(backend: Backend, case: conformance.CaseSpec, seed: int) -> CaseResult:
    inputs = conformance.case_inputs(case, backend.device, seed)
    return _result(backend, case.label, conformance.v2(backend.ops, inputs)[0])


def _check_decode(backend: Backend, case: conformance.CaseSpec, seed: int) -> CaseResult:
    inputs = conformance.case_decode_inputs(case, backend.device, seed)
    return _result(backend, f"{case.label} {inputs.layout}",
                   conformance.decode(backend.ops, inputs)[0])


def _check_cache(backend: Backend, case: conformance.CaseSpec, seed: int,
                 flash: bool = False) -> CaseResult:
    """reshape_and_cache (flash: reshape_and_cache_flash into an NHD-ordered view) of a few new
    tokens (one padding slot -1) into a poisoned cache."""
    make_inputs = conformance.case_decode_inputs if flash else conformance.case_inputs
    inputs = make_inputs(case, backend.device, seed)
    key, value, slots = conformance.case_cache_write(inputs, seed)
    op = "reshape_and_cache_flash" if flash else "reshape_and_cache"
    outcome = conformance.cache_write(backend.ops, op, key, value, inputs.key_cache,
                                      inputs.value_cache, slots, inputs.kv_cache_dtype,
                                      inputs.k_scale, inputs.v_scale)
    return _result(backend, f"{case.label} {inputs.layout}" if flash else case.label, outcome)


def _check_every_fp8_byte(backend: Backend) -> CaseResult:
    """One row: every case of conformance.EVERY_BYTE_CASES (all 256 bytes of each fp8 format
    through K and V, v1 on vLLM's layout and decode on NHD / HND); the first failure named."""
    outcomes = [conformance.every_fp8_byte(backend.ops, *case, device=backend.device)
                for case in conformance.EVERY_BYTE_CASES]
    failed = [o for o in outcomes if not o.passed]
    worst = max(o.max_abs_err for o in outcomes)
    message = f"{failed[0].op}: {failed[0].message}" if failed else ""
    return _result(backend, "every byte: e4m3, e5m2; K, V; vLLM, NHD, HND",
                   conformance.Outcome("fp8 decode", worst, message))


CHECKS = (("v1", _check_v1), ("v2", _check_v2), ("reshape_and_cache", _check_cache),
          ("decode", _check_decode),
          ("reshape_and_cache_flash", lambda b, c, s: _check_cache(b, c, s, flash=True)))


def run_checks(num_cases: int = 3, seed: Optional[int] = None,
               backends: Optional[list] = None) -> tuple:
    """Returns (seed, backends, results)."""
    seed = random.SystemRandom().randrange(1 << 31) if seed is None else seed
    backends = active_backends() if backends is None else backends
    cases = conformance.random_cases(random.Random(seed), num_cases,
                                     conformance.head_sizes(paged_attention_ext.build_info()))
    results = []
    for backend in backends:
        checks = [(op, case.label, lambda b, c=case, i=i, f=check: f(b, c, seed + i))
                  for i, case in enumerate(cases) for op, check in CHECKS]
        checks.append(("fp8 decode", "every byte", _check_every_fp8_byte))
        for op, label, check in checks:
            try:
                results.append(check(backend))
            except Exception as exc:  # an op that raises is a failure, not a crash
                results.append(CaseResult(backend.name, op, label, float("nan"), False,
                                          f"{type(exc).__name__}: {exc}".splitlines()[0]))
    return seed, backends, results


def print_report(seed: int, backends: list, results: list, console=None) -> bool:
    """Prints the table; True when everything passed (and something ran)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"check: seed {seed} (replay with --seed {seed}); backends: "
                  + (", ".join(f"{b.name} [{b.device}] {b.detail}" for b in backends) or "none"),
                  highlight=False, markup=False)
    table = Table()
    for name in ("backend", "op", "case", "max abs err", "result"):
        table.add_column(name, overflow="fold")
    for r in results:
        table.add_row(r.backend, r.op, r.case, f"{r.max_abs_err:.2e}",
                      "pass" if r.passed else f"FAIL: {r.message}",
                      style=None if r.passed else "bold red")
    console.print(table)
    failed = [r for r in results if not r.passed]
    passed = bool(results) and not failed
    summary = (f"{len(results) - len(failed)}/{len(results)} passed" if results
               else "nothing ran: no active backend")
    console.print(("OK: " if passed else "FAILED: ") + summary, highlight=False, markup=False)
    return passed
