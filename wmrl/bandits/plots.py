"""Plots of the bandit suite: suboptimality vs steps (log-log) and vs cumulative cost."""

from __future__ import annotations

import os

import matplotlib.pyplot as plt
import numpy as np
from etils import epath

from wmrl.storage import save_figure


def _band(ax, x, curves, label):
    lo, med, hi = np.percentile(curves, [25, 50, 75], axis=1)
    (line,) = ax.plot(x, np.maximum(med, 1e-4), label=label)
    ax.fill_between(
        x, np.maximum(lo, 1e-4), np.maximum(hi, 1e-4), color=line.get_color(), alpha=0.2
    )


def suite_figures(steps: np.ndarray, results: dict, threshold: float) -> dict[str, plt.Figure]:
    """Suboptimality vs steps and vs cumulative cost, log-log, one curve per variant."""
    figs = {}
    for name, xlabel in (("steps", "RL step"), ("cost", "cumulative cost (WM pull = 1)")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for variant, out in results.items():
            sub = out["curves"]["suboptimality"]
            x = steps if name == "steps" else np.median(out["curves"]["cost"], axis=1)
            _band(ax, x, sub, variant)
        ax.axhline(threshold, color="k", ls=":", lw=1, label="threshold")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("suboptimality r(a*) - E_pi r (median, IQR band)")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(alpha=0.3, which="both")
        fig.tight_layout()
        figs[f"suboptimality_vs_{name}"] = fig
    return figs


def plot_suite(
    out_dir: str | os.PathLike, steps: np.ndarray, results: dict, threshold: float
) -> list[epath.Path]:
    """Write `suboptimality_vs_steps.png` and `suboptimality_vs_cost.png` (into a local
    folder or an epath URL); return the paths."""
    out_dir = epath.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in suite_figures(steps, results, threshold).items():
        paths.append(save_figure(fig, out_dir / f"{name}.png", dpi=110))
        plt.close(fig)
    return paths
