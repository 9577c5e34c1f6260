"""The speedup benchmark's printed table and figures (`wmrl.benchmarks.speedup`'s JSON in,
text and matplotlib figures out): `table` (one row per mode, for pandas), `format_table`
(what the command prints: the per-mode table, the one-number figures and, with several
seeds, each figure's mean and 95% Student-t interval over seeds and the paired
differences), `plot_curves` (held-out reward vs training wall-clock and vs real
executions) and `plot_calibration` (the WM's reliability curves on the anchors)."""

from __future__ import annotations

import math


def _fmt(v, spec: str, none: str = "-") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def _fmt_count(v) -> str:
    """An execution count: an int for one run, a mean over seeds (one decimal) otherwise."""
    return _fmt(v, "d" if isinstance(v, int) else ".1f")


def table(result: dict) -> list[dict]:
    """One row per mode: the figures of the printed table (for pandas in the notebook)."""
    t_real = result["time_to_target_s"].get("real")
    rows = []
    for m in result["final_heldout_reward"]:
        t = result["time_to_target_s"][m]
        rows.append({
            "mode": m,
            "final_heldout_reward": result["final_heldout_reward"][m],
            "wall_time_s": result["wall_time_s"][m],
            "real_executions": result["real_executions"][m],
            "time_to_real_final_s": t,
            "speedup": t_real / t if t_real is not None and t else None,
        })  # fmt: skip
    return rows


def format_table(result: dict) -> str:
    head = (f"{'mode':<14}{'final held-out':>15}{'wall-clock s':>14}{'real execs':>12}"
            f"{'to real final s':>17}{'speedup':>9}")  # fmt: skip
    seeds = result.get("seeds") or [None]
    lines = [f"means over {len(seeds)} seeds (intervals below)"] if len(seeds) > 1 else []
    merged = (result.get("merged") or {}).get("seeds")
    if merged:
        lines.append(
            f"RL seeds {merged} taken from {', '.join(result['merged']['from'])}; the shared "
            "stages' params are "
            + ("the same for every seed" if result.get("stages_shared") else
               "NOT the same for every seed (per_seed stages_fingerprint)")
        )  # fmt: skip
    lines.append(head)
    for r in table(result):
        lines.append(
            f"{r['mode']:<14}{_fmt(r['final_heldout_reward'], '.4f'):>15}"
            f"{_fmt(r['wall_time_s'], '.1f'):>14}{_fmt_count(r['real_executions']):>12}"
            f"{_fmt(r['time_to_real_final_s'], '.1f', 'never'):>17}"
            f"{_fmt(r['speedup'], '.2f') + ('x' if r['speedup'] else ''):>9}"
        )
    a = result["amdahl"]
    ses = result.get("heldout_reward_se_at_equal_wall_clock") or {}
    pre_wmrl = (result.get("wm_pretraining_executions") or {}).get("wmrl")
    lines += [
        "",
        f"time_to_target_ratio (real / wmrl, to real's final held-out reward "
        f"{_fmt(result['time_to_target_reward'], '.4f')}): "
        f"{_fmt(result['time_to_target_ratio'], '.2f')}"
        + (f"  ({result['time_to_target_note']})" if result["time_to_target_note"] else ""),
        f"executions_to_target_ratio (real / wmrl, same target): "
        f"{_fmt(result.get('executions_to_target_ratio'), '.2f')}; counting wmrl's WM "
        f"pretraining executions ({_fmt_count(pre_wmrl)}): "
        f"{_fmt(result.get('executions_to_target_ratio_with_pretraining'), '.2f')}",
        f"held-out reward at equal wall-clock {result['equal_wall_clock_s']:.1f}s: "
        + ", ".join(
            f"{m} {_fmt(v, '.4f')}" + (f" +- {se:.4f}" if (se := ses.get(m)) is not None else "")
            for m, v in result["heldout_reward_at_equal_wall_clock"].items()
        )
        + (
            " (standard error counting the variance between held-out tasks)"
            if any(ses.values())
            else ""
        ),
        "less noisy, over the same window: mean of the last 3 evaluations "
        + ", ".join(
            f"{m} {_fmt(v, '.4f')}"
            for m, v in result.get("heldout_reward_last3_at_equal_wall_clock", {}).items()
        )
        + "; time-averaged held-out reward "
        + ", ".join(
            f"{m} {_fmt(v, '.4f')}"
            for m, v in result.get("heldout_reward_time_average", {}).items()
        ),
        f"per-step speedup {_fmt(result['per_step_speedup'], '.2f')}x "
        f"(real {_fmt(a['real_step_s'], '.2f')}s, wmrl {_fmt(a['wmrl_step_s'], '.2f')}s per step); "
        f"Amdahl bound {_fmt(result['amdahl_bound'], '.2f')}x (execution share "
        f"{_fmt(a['execute_share'], '.2f')}, anchor fraction {_fmt(a['anchor_fraction'], '.3f')}); "
        f"fraction reached {_fmt(result['amdahl_fraction_reached'], '.2f')}",
    ]
    corr = result.get("wm_stream_within_group_corr") or {}
    if corr:
        lines.append(
            "WM stream vs real reward on the anchors, within groups (correlation): "
            + ", ".join(
                f"{m} {_fmt(c['stream'], '.2f')} (raw WM {_fmt(c['raw_wm'], '.2f')})"
                for m, c in corr.items()
            )
        )
    turn1, best = (
        result.get("final_heldout_reward_turn1"),
        result.get("final_heldout_reward_best_of_k"),
    )
    if turn1 and any(v is not None for v in turn1.values()):
        lines.append(
            "final held-out reward, turn 1 -> best of K turns: "
            + ", ".join(f"{m} {_fmt(turn1[m], '.4f')} -> {_fmt(best[m], '.4f')}" for m in turn1)
        )
    if "over_seeds" in result:
        lines += ["", *format_seeds(result)]
    return "\n".join(lines)


def _stat(st: dict | None, spec: str = ".4f") -> str:
    """`mean [lo, hi]` (n if some seeds are undefined) of a `mean_ci95` dict."""
    if not st or st["mean"] is None:
        return "-"
    out = _fmt(st["mean"], spec)
    if st["ci95"] is not None:
        out += f" [{_fmt(st['ci95'][0], spec)}, {_fmt(st['ci95'][1], spec)}]"
    if st["n"] < len(st["per_seed"]):
        out += f" (n={st['n']})"
    return out


# The over-seeds lines of the table: (label, figure, number format).
SEED_LINES = (
    ("time-averaged held-out reward at equal wall-clock", "heldout_reward_time_average", ".4f"),
    ("held-out reward at equal wall-clock", "heldout_reward_at_equal_wall_clock", ".4f"),
    ("final held-out reward", "final_heldout_reward", ".4f"),
    ("time to real's final held-out reward (s)", "time_to_target_s", ".1f"),
    ("training wall-clock (s)", "wall_time_s", ".1f"),
    ("real executions", "real_executions", ".1f"),
    ("real executions to real's final held-out reward", "executions_to_target", ".1f"),
    ("mean wm_stream_corr over the run", "wm_stream_corr_mean", ".3f"),
    ("wm_stream_collapsed_groups over the run", "wm_stream_collapsed_groups", ".1f"),
    ("final held-out reward of turn 1 (multi-turn)", "final_heldout_reward_turn1", ".4f"),
    ("final held-out reward, best of K turns", "final_heldout_reward_best_of_k", ".4f"),
    ("final feedback gain (best of K - turn 1)", "final_heldout_feedback_gain", "+.4f"),
    ("warm start's feedback gain", "warmstart_heldout_feedback_gain", "+.4f"),
    (
        "fraction of held-out episodes a later turn improves",
        "final_heldout_improved_fraction",
        ".3f",
    ),
    ("mean standard error of one evaluation", "heldout_reward_se_mean", ".4f"),
    ("largest standard error of one evaluation", "heldout_reward_se_max", ".4f"),
)


def format_seeds(result: dict) -> list[str]:
    """The table's lines over seeds: each figure's mean [95% interval] per mode, the one-number
    figures, and the paired differences (same seed) between `wmrl` and the other modes."""
    seeds, over = result["seeds"], result["over_seeds"]
    lines = [f"over {len(seeds)} seed(s) {seeds}: mean [95% t-interval over seeds]"]
    for label, fig, spec in SEED_LINES:
        per = over.get(fig) or {}
        if any(v and v["mean"] is not None for v in per.values()):  # e.g. not multi-turn
            cells = "; ".join(f"{m} {_stat(v, spec)}" for m, v in per.items())
            lines.append(f"  {label}: {cells}")
    ratio = over["time_to_target_ratio"]
    lines.append(
        f"  time_to_target_ratio (real / wmrl, per seed "
        f"{', '.join(_fmt(v, '.2f', 'none') for v in ratio['per_seed'])}): {_stat(ratio, '.2f')}"
    )
    for fig in ("executions_to_target_ratio", "executions_to_target_ratio_with_pretraining"):
        lines.append(f"  {fig} (real / wmrl): {_stat(over[fig], '.2f')}")
    lines.append(f"  per-step speedup: {_stat(over['per_step_speedup'], '.2f')}")
    lines.append("paired by seed (wmrl - mode; mean difference [95% t-interval], per seed):")
    for name, figs in result["paired"].items():
        for fig in ("heldout_reward_time_average", "heldout_reward_at_equal_wall_clock",
                    "final_heldout_feedback_gain"):  # fmt: skip
            st = figs[fig]
            if st["mean"] is None:  # the feedback gain of a single-turn run
                continue
            vals = ", ".join(_fmt(v, "+.4f") for v in st["per_seed"])
            lines.append(f"  {name}, {fig}: {_stat(st, '+.4f')} ({vals})")
    return lines


def plot_curves(curves: dict[str, list[dict]], path=None, target: float | None = None,
                more_seeds=()):  # fmt: skip
    """Held-out reward vs training wall-clock (left) and vs real executions (right), one line
    per mode (the curves of `more_seeds`, other seeds' `{mode: curve}`, thin in the same
    colour); saved to `path` when given. Returns the figure."""
    from matplotlib.figure import Figure  # no pyplot: no global state, no backend switch

    fig = Figure(figsize=(11, 4))
    axes = fig.subplots(1, 2)
    for i, (m, curve) in enumerate(curves.items()):
        ev = [e for e in curve if e.get("heldout_reward") is not None]
        y = [e["heldout_reward"] for e in ev]
        se = [e.get("heldout_reward_se") or 0.0 for e in ev]  # error bars: +-1 standard error
        colour = f"C{i}"
        for ax, x in zip(axes, ("wall_time_s", "real_executions"), strict=True):
            ax.errorbar([e[x] for e in ev], y, yerr=se, fmt="o-", ms=3, capsize=2, label=m,
                        color=colour)  # fmt: skip
            for other in more_seeds:
                oe = [e for e in other.get(m, []) if e.get("heldout_reward") is not None]
                ax.plot([e[x] for e in oe], [e["heldout_reward"] for e in oe], "-", lw=0.8,
                        alpha=0.4, color=colour)  # fmt: skip
    for ax, xlabel in zip(axes, ("training wall-clock (s)", "real executions"), strict=True):
        if target is not None:
            ax.axhline(target, color="grey", ls=":", lw=1, label="real's final")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("mean held-out reward")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_calibration(cal: dict):
    """Reliability curves of `calibration(...)`: raw and debiased WM scores vs real reward."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 5))
    ax = fig.subplots()
    for name in ("raw", "debiased"):
        c = cal[name]
        ax.plot(c["score"], c["real"], "o-", label=f"{name} WM score (MAE {_fmt(c['mae'], '.3f')})")
    ax.plot([0, 1], [0, 1], "k:", lw=1)
    ax.set_xlabel("WM score (bin mean)")
    ax.set_ylabel("real reward (bin mean)")
    ax.set_title(f"WM calibration on {cal['n']} anchor trajectories")
    ax.legend()
    fig.tight_layout()
    return fig
