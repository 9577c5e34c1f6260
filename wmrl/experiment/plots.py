"""The plot every experiment's run writes: its held-out curve against its cost, with each
evaluation's standard error and the target."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from wmrl.storage import save_figure


def plot_heldout_curve(
    path: str | os.PathLike,
    evals: list[dict],
    x: str,
    metric: str,
    target: float,
    xlabel: str,
    ylabel: str,
    dpi: int = 120,
) -> None:
    """`metric` of every graded evaluation against `x` (training wall-clock, real
    executions), with error bars where the evaluations carry `<metric>_se`, and the target;
    written as a PNG to `path` (a local path or an epath URL)."""
    ev = [e for e in evals if e.get(metric) is not None]
    se = [e.get(f"{metric}_se") for e in ev]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(
        [e[x] for e in ev], [e[metric] for e in ev], marker="o", label=ylabel,
        yerr=None if any(s is None for s in se) else se,
    )  # fmt: skip
    ax.axhline(target, color="grey", ls=":", label=f"target {target}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=dpi)
    plt.close(fig)
