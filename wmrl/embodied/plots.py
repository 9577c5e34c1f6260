"""Plots of one embodied run: held-out success vs real executions, and the WM diagnostics."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from wmrl.experiment.plots import plot_heldout_curve
from wmrl.storage import save_figure


def plot_run(plot_dir: Path, records: list[dict], target: float) -> None:
    plot_dir = Path(plot_dir)
    plot_dir.mkdir(parents=True, exist_ok=True)
    evals = [r for r in records if r["kind"] == "eval"]
    steps = [r for r in records if r["kind"] == "step"]
    plot_heldout_curve(
        plot_dir / "heldout_success.png", evals, "real_executions", "heldout_success", target,
        xlabel="real executions (simulator episodes) in RL", ylabel="held-out success", dpi=80,
    )  # fmt: skip
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    x = [r["step"] for r in steps]
    ax[0].plot(x, [r["real_success"] for r in steps], label="real success (anchors)")
    if steps and "imagined_success" in steps[-1]:
        ax[0].plot(x, [r.get("imagined_success") for r in steps], label="imagined (raw WM)")
        ax[0].plot(x, [r.get("imagined_success_calibrated") for r in steps], label="calibrated")
        ax[1].plot(x, [r.get("anchor_auc") for r in steps], label="within-group AUC")
        ax[1].plot(x, [r.get("bias_reduction") for r in steps], label="bias reduction")
        corr = [r.get("wm_stream_corr") for r in steps]
        ax[1].plot(x, [float("nan") if c is None else c for c in corr], label="wm_stream_corr")
    ax[0].set_xlabel("RL step")
    ax[1].set_xlabel("RL step")
    for a in ax:
        if a.get_legend_handles_labels()[0]:
            a.legend()
    fig.tight_layout()
    save_figure(fig, plot_dir / "wm_diagnostics.png", dpi=80)
    plt.close(fig)
