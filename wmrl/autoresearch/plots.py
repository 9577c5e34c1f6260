"""Plots of an AutoResearch run: held-out reward vs wall-clock, WM calibration, corrections."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from etils import epath

from wmrl.experiment.plots import plot_heldout_curve
from wmrl.storage import save_figure


def reliability(
    pred: np.ndarray, real: np.ndarray, bins: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Mean real reward per equal-width bin of predicted reward over [0, 1] (empty bins dropped)."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(pred, edges) - 1, 0, bins - 1)
    xs, ys = [], []
    for b in range(bins):
        sel = idx == b
        if sel.any():
            xs.append(pred[sel].mean())
            ys.append(real[sel].mean())
    return np.array(xs), np.array(ys)


def plot_cost_routing(workdir: str | os.PathLike, steps: list[dict]) -> None:
    """`<workdir>/plots/cost_routing.png` (cost-aware routing): the cap in force and the share
    of rows whose reward is a real outcome, per step."""
    out = epath.Path(workdir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    x = [s["step"] for s in steps]
    fig, (cap, share) = plt.subplots(2, 1, figsize=(6, 5), sharex=True)
    cap.plot(x, [s["cheap_limit_s"] for s in steps], "o-")
    cap.set_ylabel("cap in force (s)")
    cap.set_title("cost-aware routing")
    share.plot(x, [s["real_row_share"] for s in steps], "o-")
    share.set_ylim(0, 1.05)
    share.set_xlabel("RL step")
    share.set_ylabel("real-row share")
    fig.tight_layout()
    save_figure(fig, out / "cost_routing.png", dpi=120)
    plt.close(fig)


def plot_run(
    workdir: str | os.PathLike,
    steps: list[dict],
    evals: list[dict],
    pairs: list[dict],
    target: float,
) -> None:
    """Write the three plots into `<workdir>/plots` (a local folder or an epath URL)."""
    out = epath.Path(workdir) / "plots"
    out.mkdir(parents=True, exist_ok=True)

    plot_heldout_curve(
        out / "heldout_reward.png", evals, "wall_time_s", "heldout_reward", target,
        xlabel="training wall-clock (s)", ylabel="mean held-out reward",
    )  # fmt: skip

    fig, ax = plt.subplots(figsize=(5, 5))
    if pairs:
        raw = np.array([p["r_wm"] for p in pairs])
        cal = np.array([p["r_cal"] for p in pairs])
        env = np.array([p["r_env"] for p in pairs])
        for x, name in ((raw, "raw WM"), (cal, "after debiasing")):
            bx, by = reliability(x, env)
            ax.plot(bx, by, "o-", label=f"{name} (MAE {np.abs(x - env).mean():.3f})")
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.set_xlabel("WM score")
    ax.set_ylabel("real reward (bin mean)")
    ax.set_title("WM calibration on anchor trajectories")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out / "wm_calibration.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [s["step"] for s in steps]
    ax.plot(xs, [s.get("anchor_weight") or 1.0 for s in steps], label="anchor weight")
    ax.plot(xs, [s.get("bias_reduction") or 0.0 for s in steps], label="bias reduction")
    ax.set_xlabel("RL step")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out / "corrections.png", dpi=120)
    plt.close(fig)
