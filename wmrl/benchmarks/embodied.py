"""Embodied benchmark: real executions (and wall-clock) to a held-out success target, `wmrl` vs
`real` with identical hyperparameters, several seeds, plus the ablations and WM diagnostics.

    python -m wmrl.benchmarks.embodied --workdir=runs/embodied_bench --seeds=5 \\
        --out=embodied_bench.json

The stages (expert demos, BC, WM pretraining) are built once in `<workdir>/init` and shared
by every run; seeds differ in policy sampling, task order and routing (`config.rl.seed`), and
every run is evaluated on the same held-out start states. A finished run (its summary.json) is
reused (one written under older key names is read under today's,
`wmrl.experiment.renamed.upgrade_keys`), so an interrupted benchmark continues where it
stopped; a run saved with another config (say `--steps=80` over 40-step runs) is refused,
naming the fields, never reported as this one.

Cost is counted in real executions (an embodied execution is one simulator episode), what a
robot would pay; the WM's pretraining rollouts of the BC policy are real executions too and
are reported next to the ratio (with and without them). Wall-clock is measured simulation
time on this machine and is reported separately: real rollouts are cheap in simulation, so
no wall-clock saving is claimed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from wmrl.benchmarks.common import machine
from wmrl.embodied import experiment
from wmrl.experiment.config import get_field, load_config_file, set_fields
from wmrl.experiment.renamed import upgrade_keys
from wmrl.experiment.stats import bootstrap_diff_ci, mean_bootstrap_ci95

CONFIG_FILE = Path(__file__).resolve().parents[2] / "configs" / "embodied_push.py"

MAIN_MODES = ("real", "wmrl")
ABLATIONS = ("wm_only", "debias_only", "denoise_only", "static_anchors")


def to_target(curve, target, key):
    """(value at the first evaluation at or above target, reached?); never reached: the
    run's total (a lower bound, flagged)."""
    for e in curve:
        if experiment.reached(e["heldout_success"], target):
            return e[key], True
    return curve[-1][key], False


def success_at_budget(curve, budget):
    """Held-out success of the last evaluation made within `budget` real executions."""
    ok = [e for e in curve if e["real_executions"] <= budget]
    return ok[-1]["heldout_success"]


# Fields the benchmark sets itself: `--set` may not override them (it would be undone).
FLAG_FIELDS = {
    "mode": "--ablations (the main modes are always real and wmrl)",
    "obs": "--obs",
    "rl.seed": "--seeds",
    "rl.steps": "--steps",
    "target_success": "--target",
    "init_dir": "--workdir (the stages are <workdir>/init)",
    "env.real_episode_cost_s": "--real_episode_cost_s",
}


def apply_overrides(c, overrides) -> None:
    """`--set=field=value` (e.g. `demos.episodes=2000`): the value parsed as the field's type;
    an unknown field, a value of the wrong type or a field that a flag sets is an error naming
    the flag."""
    for item in overrides:
        name, sep, text = item.partition("=")
        if name in FLAG_FIELDS:
            raise ValueError(f"--set={item}: config.{name} is set by {FLAG_FIELDS[name]}")
        try:
            old = get_field(c, name)
        except (KeyError, AttributeError, TypeError, ValueError):
            raise ValueError(f"--set={item}: no config field {name!r}") from None
        if not sep or isinstance(old, (dict, list, tuple)) or hasattr(old, "to_dict"):
            raise ValueError(f"--set={item}: expected field=value for a scalar field")
        try:
            if isinstance(old, bool):
                if text not in ("True", "False", "true", "false"):
                    raise ValueError(text)
                value = text.lower() == "true"
            else:
                value = type(old)(text)
        except ValueError:
            raise ValueError(
                f"--set={item}: {text!r} is not of type {type(old).__name__} (config.{name})"
            ) from None
        set_fields(c, {name: value})


def make_config(
    args_tiny, steps, mode, seed, init_dir, target, cost_s=0.0, obs="state", overrides=()
):
    c = load_config_file(CONFIG_FILE, "tiny" if args_tiny else None)
    apply_overrides(c, overrides)
    c.mode = mode
    c.obs = obs
    c.env.real_episode_cost_s = float(cost_s)
    c.rl.seed = seed
    c.init_dir = str(init_dir)
    if steps:
        c.rl.steps = steps
    if target >= 0:
        c.target_success = target
    return c


def wm_diagnostics(workdir: Path, runs: list[str]) -> dict:
    """Within-group AUC of WM scores vs real success on the anchors, imagined vs real success
    over training (in quarters), bias reduction, the WM stream's within-group rank agreement
    with real success on the anchors (`wm_stream_corr`, the core's) and the fraction of WM
    groups whose calibrated scores are all equal (no GRPO signal); means over the given runs
    (a key a run did not log, e.g. one made before it existed, is None there)."""
    quarters = {
        "anchor_auc": [],
        "imagined_success": [],
        "imagined_success_calibrated": [],
        "real_success": [],
        "bias_reduction": [],
        "wm_stream_corr": [],
        "wm_groups_flat": [],
    }
    for name in runs:
        recs = experiment.read_metrics(workdir / name)
        steps = [r for r in recs if r["kind"] == "step"]
        parts = np.array_split(np.arange(len(steps)), 4)
        for key in quarters:
            row = []
            for idx in parts:
                vals = [steps[i].get(key) for i in idx]
                vals = [v for v in vals if v is not None and v == v]
                row.append(float(np.mean(vals)) if vals else None)
            quarters[key].append(row)
    out = {}
    for key, rows in quarters.items():
        cols = list(zip(*rows, strict=False)) if rows else []
        out[key + "_by_quarter"] = [
            float(np.mean([v for v in col if v is not None]))
            if any(v is not None for v in col)
            else None
            for col in cols
        ]
    return out


def run_benchmark(
    workdir,
    seeds,
    ablation_seeds,
    steps=0,
    target=-1.0,
    tiny=False,
    ablations=ABLATIONS,
    real_episode_cost_s=0.0,
    obs="state",
    overrides=(),
) -> dict:
    workdir = Path(workdir)
    init = workdir / "init"
    plan = [(m, s) for s in range(seeds) for m in MAIN_MODES]
    unknown = [m for m in ablations if m not in ABLATIONS]
    if unknown:
        raise ValueError(f"--ablations: unknown mode(s) {unknown}; choose from {ABLATIONS}")
    plan += [(m, s) for s in range(ablation_seeds) for m in ablations]
    summaries, t0 = {}, time.monotonic()
    for mode, seed in plan:
        name = f"{mode}_s{seed}"
        wd = workdir / name
        config = make_config(
            tiny, steps, mode, seed, init, target, real_episode_cost_s, obs, overrides
        )
        # A finished run is reused only if it was made with this config (e.g. --steps=80 over
        # 40-step runs is refused, naming rl.steps). Not `init_dir`: the stages are always
        # <workdir>/init, so a copied or moved benchmark folder carries its own. Not
        # `target_success`: training never reads it, and the executions to the target are
        # recomputed below from each run's held-out curve, so one set of runs can be read at
        # another --target.
        experiment.check_resumable(config, wd, ignore=("init_dir", "target_success"))
        if (wd / "summary.json").exists():
            summaries[name] = upgrade_keys(json.loads((wd / "summary.json").read_text()))
        else:
            wd.mkdir(parents=True, exist_ok=True)
            (wd / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")
            summaries[name] = experiment.run(config, wd)
        s = summaries[name]
        print(
            f"{name:18s} held-out {s['warmstart_heldout_success']:.3f} -> "
            f"{s['final_heldout_success']:.3f}  real executions {s['real_executions']}",
            flush=True,
        )
    tgt = float(config.target_success)  # this invocation's, not the one a reused run saved
    modes = list(dict.fromkeys(m for m, _ in plan))
    by_mode = {
        m: [summaries[f"{m}_s{s}"] for s in range(seeds if m in MAIN_MODES else ablation_seeds)]
        for m in modes
    }
    # a fixed budget of real executions: what wmrl spends in a whole run
    budget = min(s["real_executions"] for s in by_mode["wmrl"])
    result = {
        "machine": machine(),
        "observations": obs,
        "overrides": list(overrides),
        "target_success": tgt,
        "seeds": seeds,
        "ablation_seeds": ablation_seeds,
        "steps": next(iter(summaries.values()))["steps"],
        "real_executions_to_target": {},
        "wall_time_to_target_s": {},
        "reached_target": {},
        "success_at_budget": {"budget_real_executions": budget},
        "final_heldout_success": {},
        "warmstart_heldout_success": float(by_mode["real"][0]["warmstart_heldout_success"]),
        "real_executions": {},
        "wm_episodes": {},
        "stage_real_executions": by_mode["wmrl"][0]["stage_real_executions"],
        "wall_time_s": {},
    }
    for m, runs in by_mode.items():
        hits = [to_target(s["heldout_curve"], tgt, "real_executions") for s in runs]
        walls = [to_target(s["heldout_curve"], tgt, "wall_time_s") for s in runs]
        result["real_executions_to_target"][m] = mean_bootstrap_ci95([h for h, _ in hits])
        result["wall_time_to_target_s"][m] = mean_bootstrap_ci95([w for w, _ in walls])
        result["reached_target"][m] = sum(ok for _, ok in hits)
        result["success_at_budget"][m] = mean_bootstrap_ci95(
            [success_at_budget(s["heldout_curve"], budget) for s in runs]
        )
        result["final_heldout_success"][m] = mean_bootstrap_ci95(
            [s["final_heldout_success"] for s in runs]
        )
        result["real_executions"][m] = mean_bootstrap_ci95([s["real_executions"] for s in runs])
        result["wm_episodes"][m] = mean_bootstrap_ci95([s["wm_episodes"] for s in runs])
        result["wall_time_s"][m] = mean_bootstrap_ci95([s["wall_time_s"] for s in runs])
    r, w = (result["real_executions_to_target"][m]["mean"] for m in ("real", "wmrl"))
    pre = result["stage_real_executions"]["wm_pretrain_rollouts"]
    both = all(result["reached_target"][m] == len(by_mode[m]) for m in MAIN_MODES)
    result["ratio_real_over_wmrl"] = {
        "executions_to_target": r / w if both and w else None,
        "executions_to_target_counting_wm_pretrain_rollouts": r / (w + pre) if both else None,
        "note": "None unless every seed of both modes reached the target",
    }
    ratio = result["ratio_real_over_wmrl"]["executions_to_target"]
    final = {m: result["final_heldout_success"][m]["mean"] for m in MAIN_MODES}
    result["goal"] = {
        "want": ">= 3x fewer real executions to the target than real, final held-out success "
        "equal or better (means over seeds)",
        "ratio": ratio,
        "final_wmrl_minus_real": final["wmrl"] - final["real"],
        # how far the seeds pin the difference down (the goal itself reads the means)
        "final_wmrl_minus_real_ci95": bootstrap_diff_ci(
            result["final_heldout_success"]["wmrl"]["per_seed"],
            result["final_heldout_success"]["real"]["per_seed"],
        ),
        "met": bool(ratio is not None and ratio >= 3.0 and final["wmrl"] >= final["real"]),
    }
    cost = float(next(iter(summaries.values())).get("real_episode_cost_s", 0.0))
    result["real_episode_cost_s"] = cost
    result["cost_note"] = (
        "cost = real executions (simulator episodes); wall_time_* is measured simulation time "
        "on this machine, not a robot's"
    )
    if cost > 0:  # a declared latency per real execution (env.real_episode_cost_s): a model
        result["modelled_robot_time_to_target_s"] = {
            m: mean_bootstrap_ci95([None if e is None else e * cost for e in v["per_seed"]])
            for m, v in result["real_executions_to_target"].items()
        }
        result["cost_note"] += (
            f"; modelled_robot_time_to_target_s = real executions x the declared {cost} s "
            "(env.real_episode_cost_s), a model, not a measurement"
        )
    result["wm_diagnostics"] = wm_diagnostics(workdir, [f"wmrl_s{s}" for s in range(seeds)])
    result["benchmark_s"] = time.monotonic() - t0
    return result


def print_table(res: dict) -> None:
    print(
        f"\ntarget held-out success {res['target_success']} (warm start "
        f"{res['warmstart_heldout_success']:.3f}); cost = real executions (simulator episodes); "
        f"observations: {res['observations']}"
    )
    print(
        f"{'mode':14s} {'executions to target':>26s} {'reached':>8s} {'final held-out':>22s}"
        f" {'at budget':>10s} {'wall s':>8s}"
    )
    for m in res["final_heldout_success"]:
        e, f = res["real_executions_to_target"][m], res["final_heldout_success"][m]
        ci = e["ci95"] or [float("nan")] * 2
        fci = f["ci95"] or [float("nan")] * 2
        print(
            f"{m:14s} {e['mean']:9.0f} [{ci[0]:6.0f},{ci[1]:6.0f}] "
            f"{res['reached_target'][m]:>5d}/{e['n']:<2d} {f['mean']:8.3f} [{fci[0]:.3f},"
            f"{fci[1]:.3f}] {res['success_at_budget'][m]['mean']:10.3f} "
            f"{res['wall_time_s'][m]['mean']:8.1f}"
        )
    print("ratio real/wmrl:", res["ratio_real_over_wmrl"])
    g, ci = res["goal"], res["goal"].get("final_wmrl_minus_real_ci95") or [float("nan")] * 2
    print(f"final wmrl - real: {g['final_wmrl_minus_real']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]")
    print("goal met:", res["goal"]["met"], "|", res["cost_note"])
    print("WM diagnostics:", json.dumps(res["wm_diagnostics"]))


def define_flags() -> dict:
    """The command's flags, defined when it runs (importing this module from a library or a
    test must not add flags to the process's global FLAGS: `wmrl.main` defines `workdir` too)."""
    f = {
        "workdir": flags.DEFINE_string("workdir", None, "Folder for the shared stages and runs."),
        "seeds": flags.DEFINE_integer("seeds", 5, "Seeds of `real` and `wmrl`."),
        "ablation_seeds": flags.DEFINE_integer(
            "ablation_seeds", 1, "Seeds of each ablation (0 = off)."
        ),
        "ablations": flags.DEFINE_list(
            "ablations", "wm_only,debias_only,denoise_only,static_anchors", "Ablation modes to run."
        ),
        "out": flags.DEFINE_string("out", None, "JSON output file."),
        "steps": flags.DEFINE_integer("steps", 0, "RL steps per run (0 = the config's)."),
        "target": flags.DEFINE_float(
            "target",
            -1.0,
            "Held-out success target (<0 = config's); finished runs are re-read at it.",
        ),
        "tiny": flags.DEFINE_boolean("tiny", False, "The seconds-long tiny setting (tests)."),
        "obs": flags.DEFINE_enum(
            "obs", "state", ["state", "image"], "Observations (config.obs): state or image."
        ),
        "set": flags.DEFINE_multi_string(
            "set", [], "field=value config overrides for every run (e.g. demos.episodes=2000)."
        ),
        "real_episode_cost_s": flags.DEFINE_float(
            "real_episode_cost_s",
            0.0,
            "Declared robot latency per real episode (env.real_episode_cost_s; modelled only).",
        ),
    }
    flags.mark_flags_as_required(["workdir", "out"])
    return f


def main(argv, f: dict):
    del argv
    res = run_benchmark(
        f["workdir"].value,
        f["seeds"].value,
        f["ablation_seeds"].value,
        f["steps"].value,
        f["target"].value,
        f["tiny"].value,
        tuple(f["ablations"].value),
        f["real_episode_cost_s"].value,
        f["obs"].value,
        tuple(f["set"].value),
    )
    print_table(res)
    Path(f["out"].value).write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {f['out'].value}")


if __name__ == "__main__":
    _flags = define_flags()
    app.run(lambda argv: main(argv, _flags))
