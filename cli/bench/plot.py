"""The bench's PNG: speedups, acceptance and inter-token latency histograms."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import click

from .methods import LOOKAHEAD, PLAIN, method_order
from .summary import Run


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "--plot needs matplotlib, which is not installed: run `pip install 'lookahead[bench]'` "
            "(in a checkout: .venv/bin/pip install -e '.[bench]', or bash scripts/setup.sh)"
        ) from None


def plot(path: Path, summaries: Sequence[dict], runs: Sequence[Run]) -> None:
    """(a) speedup per category and method, (b) acceptance per category, (c) inter-token latencies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    categories = list(dict.fromkeys(s["category"] for s in summaries))
    temps = list(dict.fromkeys(s["temperature"] for s in summaries))
    by_key = {(s["category"], s["temperature"]): s for s in summaries}
    x = np.arange(len(categories))
    fig, (ax_speed, ax_acc, ax_lat) = plt.subplots(1, 3, figsize=(17, 5))

    def bars(ax, series: list[tuple[str, list[float]]]):
        width = 0.8 / max(len(series), 1)
        for i, (label, values) in enumerate(series):
            ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
        ax.set_xticks(x, categories, rotation=30, ha="right")
        ax.legend(fontsize=8)

    methods = sorted({m for s in summaries for m in s["speedup"]}, key=method_order)
    bars(ax_speed, [(f"{m} t={t:g}", [by_key[c, t]["speedup"].get(m) or 0 for c in categories])
                    for m in methods for t in temps])
    ax_speed.axhline(1.0, color="black", linewidth=1)
    ax_speed.set_ylabel("speedup over plain (geometric mean)")
    ax_speed.set_title("(a) speedup per category")

    drafting = sorted({m for s in summaries for m in s["speculation"]}, key=method_order)
    bars(ax_acc, [(f"{m} t={t:g}", [by_key[c, t]["speculation"].get(m, {}).get("acceptance_rate") or 0
                                     for c in categories]) for m in drafting for t in temps])
    ax_acc.set_ylim(0, 1)
    ax_acc.set_ylabel("accepted / drafted")
    ax_acc.set_title("(b) draft acceptance per category")

    gaps = {m: [g for r in runs if r.method == m for g in r.gaps_ms if g > 0] for m in (PLAIN, LOOKAHEAD)}
    all_gaps = [g for gs in gaps.values() for g in gs]
    if all_gaps:
        edges = np.logspace(math.log10(min(all_gaps)), math.log10(max(all_gaps) * 1.01), 60)
        for m, gs in gaps.items():
            if gs:
                ax_lat.hist(gs, bins=edges, histtype="step", linewidth=1.5, label=f"{m} ({len(gs)} gaps)")
        ax_lat.set_xscale("log")
        ax_lat.legend(fontsize=8)
    ax_lat.set_xlabel("time between streamed chunks (ms, log scale)")
    ax_lat.set_ylabel("count")
    ax_lat.set_title("(c) inter-token latency")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
