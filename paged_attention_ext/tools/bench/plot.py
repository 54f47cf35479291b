"""`--plot FILE.png`: GB/s against context length, one line per contender, one panel per shape
family, with the measured read bandwidth as the ceiling. matplotlib is optional."""

from __future__ import annotations

import math


class PlotUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotUnavailable("--plot needs matplotlib: pip install matplotlib") from exc
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    import matplotlib.ticker as ticker
    return plt, ticker


def check_available():
    """Raises PlotUnavailable before a long run whose plot could not be drawn."""
    _pyplot()


def _tokens(n: float) -> str:
    return f"{n / 1024:g}k" if n >= 1024 and n % 1024 == 0 else (
        f"{n / 1000:g}k" if n >= 1000 and n % 1000 == 0 else f"{n:g}")


def save_plot(data: dict, path: str):
    plt, ticker = _pyplot()
    rows = [r for r in data["results"] if r.get("gbps")]
    families = list(dict.fromkeys(r["shape"]["family"] for r in data["results"]))
    cols = 2 if len(families) in (2, 4) else min(3, max(1, len(families)))
    nrows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.8 * nrows), squeeze=False)
    bw = data["bandwidth"]
    contenders = list(dict.fromkeys(r["contender"] for r in data["results"]))
    colors = {name: f"C{i}" for i, name in enumerate(contenders)}
    for ax, family in zip(axes.flat, families):
        sample = next(r for r in data["results"] if r["shape"]["family"] == family)["shape"]
        for name in contenders:
            points = sorted((r["shape"]["ctx"], r["gbps"]) for r in rows
                            if r["shape"]["family"] == family and r["contender"] == name)
            if points:
                ax.plot(*zip(*points), marker="o", color=colors[name], label=name)
        ax.axhline(bw["read_gbps"], color="k", linestyle="--", linewidth=1,
                   label=f"read BW {bw['read_gbps']:.0f} GB/s")
        ax.axhline(bw["copy_gbps"], color="gray", linestyle=":", linewidth=1,
                   label=f"copy BW {bw['copy_gbps']:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")  # contenders span orders of magnitude
        ctxs = sorted({r["shape"]["ctx"] for r in data["results"]
                       if r["shape"]["family"] == family})
        ax.set_xticks(ctxs, [_tokens(c) for c in ctxs])
        ax.xaxis.set_minor_locator(ticker.NullLocator())
        if len(ctxs) == 1:
            ax.set_xlim(ctxs[0] / 2, ctxs[0] * 2)
        ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("GB/s (K+V once + q + out)")
        ax.set_title(f"{family}: batch {sample['batch']}, {sample['heads']}/{sample['kv_heads']} "
                     f"heads, d {sample['head']}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(families):]:
        ax.set_visible(False)
    c, m = data["config"], data["machine"]
    fig.suptitle(f"paged attention decode, {c['device']} {c['dtype']}, kv cache "
                 f"{c['kv_cache_dtype']}, {c['mode']}\n{m.get('gpu') or m['host_cpu']}, "
                 f"{m['torch_threads']} threads, torch {m['torch']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
