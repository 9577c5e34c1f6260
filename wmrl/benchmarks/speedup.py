"""Wall-clock speedup of WMRL over standard GRPO (`real`) on Mini AutoResearch.

    python -m wmrl.benchmarks.speedup --workdir=DIR [--budget_s=S] [--seeds=N] [--out=FILE.json]
        [--ablations | --modes=real,wmrl,...] [--steps=N] [--eval_samples=K] [--merge=A.json,..]
        [--config=configs/autoresearch_tiny.py --config.rl.steps=...]

Runs the shared stages once into DIR/shared (the data stage in DIR/shared/data, the warm start
and the world-model pretraining in DIR/shared/init, unless the config names other
`data_dir` / `init_dir`), then `real`, `wmrl` and the control `static_anchors` (the same
anchors and static check, every other WM row one shared reward: what `wmrl` gains over it is
the world model's contribution; with `--ablations` also `wm_only`, `debias_only`,
`denoise_only` and the control `permuted_wm`, `wmrl` with its learned rows' scores permuted
within each group: the WM's spread without its information; `--modes=` picks any of them),
each in DIR/<mode>, one after the other, every one from the
same warm-start and WM checkpoints with the same seed and sandbox pool size.

Each stage and each mode runs in a fresh process, so no mode inherits another's JIT caches
(otherwise the second mode would skip the sampler's compilation). A mode whose
DIR/<mode>/summary.json exists is reused, and an interrupted mode resumes from its checkpoints,
so rerunning the same command finishes an interrupted benchmark; delete DIR/<mode> to rerun a
mode. A mode directory that holds a run with a different config is refused.

`--seeds=N` (default 1) runs every mode once per seed, seed by seed: the first seed in
DIR/<mode>, seed i > 0 in DIR/<mode>-seed<i> with `rl.seed` = the first's RL seed + i, so policy
sampling, task order, routing and the executions differ between seeds while the shared stages
(data, tokenizer, warm start, pretrained WM: they depend on `seed`, not `rl.seed`) are built
once for all. A finished (mode, seed) run is reused, so `--seeds=3` after `--seeds=1` runs only
the two new seeds. Every figure is computed per seed (`per_seed`), then reported over seeds
(`over_seeds`: per figure and mode `mean`, `ci95` (Student-t 95% interval of the mean), `n`,
`per_seed`), and comparisons between modes are paired by seed (`paired`: `"wmrl - <mode>"`,
the mean per-seed difference and its interval, e.g. the time-averaged held-out reward at equal
wall-clock; `time_to_target_ratio` is itself a per-seed ratio, in `over_seeds`). The JSON's
older keys keep their shapes and hold the mean over seeds (None where a seed has None; with
one seed, that seed's values); `curves` holds the first seed's curves.

A benchmark longer than one machine's lifetime is run in parts: `--merge=EARLIER.json` takes
the seeds an earlier run of the same benchmark already measured from that JSON's `per_seed`
(every config field but the paths and the RL seed, `config_all`, the budget and the modes the
same, else refused naming them) and runs only the others,
so `--seeds=5 --merge=seeds01.json` runs seeds 2-4 and reports all five, paired and over
seeds as if they had run together. Every seed records `stages_fingerprint`, the sha256 of the
shared stages' parameters (`wmrl.experiment.stages.params_digest`, per stage), and the JSON
says whether all its seeds share one (`stages_shared`): deterministic stages rebuilt on
another machine give the same bits, and where they do not, the JSON says so instead of
pairing across different warm starts silently.

Multi-turn configs (`env.turns` > 1, `configs/autoresearch_multiturn.py`) run unchanged; the
JSON adds per mode the held-out reward of turn 1 and of the best of K turns, their difference
(`final_heldout_feedback_gain`: does the agent use the feedback?) and the fraction of episodes
a later turn improves, for the warm start and the final policy (None for single-turn runs).

`--budget_s` gives every mode the same RL wall-clock budget (`rl.max_wall_time_s`) and, unless
`--steps` is given, lifts the step limit so that the budget alone ends each run; every mode is
then evaluated at the same training wall-clock points instead of every `rl.eval_every` steps,
plus at the end: `rl.eval_at_s` (default: 12 points spaced geometrically from budget / 32 to
the budget, so that a time ratio has the same resolution wherever the target is reached) or
every `rl.eval_every_s` seconds if that is set. Without it,
each mode runs `rl.steps` (or `--steps`), evaluated by step count. Wall-clock is RL training
time as `wmrl.autoresearch` measures it (evaluations and checkpoint writes excluded, XLA compilation
done before the clock starts).

Every evaluation executes `--eval_samples` (default 5) scripts per held-out task, more than
`make run`'s 3, so that one evaluation's standard error (counting the variance between
held-out tasks) is ~0.03; the JSON reports it per mode (`heldout_reward_se_mean`,
`heldout_reward_se_max` over the run's evaluations).

Real executions to the same target (real's final held-out reward) are compared too:
`executions_to_target_ratio` (E_real / E_wmrl, RL's executions) and
`executions_to_target_ratio_with_pretraining`, which adds to wmrl's the executions spent
before RL on its WM's training data (`wm_pretraining_executions` of its summary: the executed
corpus and, with `wm.policy_samples_per_task`, the policy samples), as embodied counts its
WM-pretraining rollouts.

Writes `--out` (default DIR/speedup.json), DIR/speedup.png (held-out reward vs training
wall-clock and vs real executions, +-1 standard error bars) and prints a table. This module
is the analysis (and the command); the printed table and the plots are `speedup_report`'s,
the runner is `speedup_runner`, and the figures are defined in `speedup_figures` next to
the functions that compute them:
`wmrl.autoresearch.experiment.time_to_target`, `time_to_target_ratio`,
`reward_at_equal_wall_clock`, `se_at_wall_clock`, `time_average_reward`,
`recent_mean_reward`, `amdahl`, `within_group_correlation` (how much GRPO signal the WM stream
carries, on the anchors) and `static_check_stats` (precision and recall of `rl.static_check`
on the anchors).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from wmrl.autoresearch.experiment import time_to_target
from wmrl.benchmarks.speedup_figures import (
    amdahl,
    eval_se_stats,
    executions_to_target,
    executions_to_target_ratio,
    mean_step_time,
    recent_mean_reward,
    reward_at_equal_wall_clock,
    se_at_wall_clock,
    static_check_stats,
    time_average_reward,
    time_to_target_ratio,
    within_group_correlation,
)  # fmt: skip
from wmrl.benchmarks.speedup_report import format_table, plot_curves
from wmrl.benchmarks.speedup_runner import (
    ALL_MODES,
    MODES,
    known_mode,
    load_runs,
    modes_for,
    run_modes,
    seeds_of,
    shared_config,
)
from wmrl.experiment.config import flatten, plain
from wmrl.experiment.stats import mean_ci95

ROOT = Path(__file__).resolve().parents[2]

# Config fields copied into the JSON (`config`).
CONFIG_KEYS = (
    "seed", "routing", "target_reward", "suite.tasks", "suite.workers", "suite.time_limit_s",
    "rl.steps", "rl.max_wall_time_s", "rl.groups_per_step", "rl.group_size", "rl.batch_size",
    "rl.eval_every", "rl.eval_every_s", "rl.eval_at_s", "rl.eval_samples", "rl.anchor_lag",
    "correction.rho", "correction.min_groups", "correction.uncertainty_share", "policy.d_model",
    "policy.num_layers", "wm.d_model", "wm.num_layers", "wm.num_members", "data.max_prompt_len",
    "data.max_new_tokens", "rl.seed",
)  # fmt: skip

# Figures reported over seeds: {mode: number} ones, one number per seed, and those paired by
# seed between `wmrl` and every other mode (held-out reward at equal wall-clock, three views).
MODE_FIGURES = (
    "final_heldout_reward", "heldout_reward_at_equal_wall_clock", "heldout_reward_time_average",
    "heldout_reward_last3_at_equal_wall_clock", "heldout_reward_se_at_equal_wall_clock",
    "time_to_target_s", "step_time_s", "steps", "wall_time_s", "real_executions", "wm_calls",
    "executions_to_target",
    "warmstart_heldout_reward", "best_heldout_reward", "wm_stream_corr_mean",
    "wm_stream_collapsed_groups", "heldout_reward_se_mean", "heldout_reward_se_max",
    *(f"{when}_heldout_{fig}" for when in ("warmstart", "final")
      for fig in ("reward_turn1", "reward_best_of_k", "feedback_gain")),
    "final_heldout_improved_fraction",
)  # fmt: skip
SCALAR_FIGURES = (
    "time_to_target_ratio", "time_to_target_reward", "equal_wall_clock_s", "amdahl_bound",
    "per_step_speedup", "amdahl_fraction_reached", "executions_to_target_ratio",
    "executions_to_target_ratio_with_pretraining",
)  # fmt: skip
PAIRED_FIGURES = (
    "heldout_reward_time_average", "heldout_reward_at_equal_wall_clock",
    "heldout_reward_last3_at_equal_wall_clock", "final_heldout_reward",
    "final_heldout_feedback_gain",
)  # fmt: skip
# Scripts per held-out task in each evaluation of the command-line benchmark: the tiny
# config's 32 held-out tasks x 5 = 160 executions put one evaluation's standard error
# (counting the variance between tasks) near 0.03, from 0.034-0.039 at `make run`'s 3
# (docs/results.md, "the held-out evaluation's standard error"); `make run` keeps 3 for time.
EVAL_SAMPLES = 5

# Keys that are not figures: the first seed's value at the top level.
FIRST_SEED_KEYS = ("curves", "config", "machine", "budget_s", "stages_fingerprint")


# -- the analysis --------------------------------------------------------------------------


# Config fields that name where this machine keeps things or which seed runs, left out of the
# benchmark's identity (`config_all`): a benchmark continued elsewhere (`--merge`) has other
# paths and its own seeds.
LOCAL_FIELDS = ("data_dir", "init_dir", "rl.seed")


def _config_fields(config) -> dict:
    """`CONFIG_KEYS` of a config (None for a field it does not have)."""
    flat = flatten(plain(config))
    return {k: flat.get(k) for k in CONFIG_KEYS}


def config_all(config) -> dict:
    """Every field of the benchmark's shared config but `LOCAL_FIELDS`, as JSON values: what
    two parts of one benchmark must share (`--merge`)."""
    flat = flatten(plain(config))
    return json.loads(json.dumps({k: v for k, v in flat.items() if k not in LOCAL_FIELDS}))


def machine(runs: dict | None = None) -> dict:
    device = None
    for r in (runs or {}).values():
        device = device or r["summary"].get("device")
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "device": device,
    }


def analyse(runs: dict, config=None, budget_s: float | None = None, warmup: int = 1) -> dict:
    """The benchmark's JSON from the runs (`load_runs`); `real` and `wmrl` must be present."""
    curves = {m: r["summary"]["heldout_curve"] for m, r in runs.items()}
    ttt = time_to_target_ratio(curves, "wmrl")
    target = ttt["target"]
    t_equal, at_equal = reward_at_equal_wall_clock(curves)
    amd = amdahl(runs["real"]["steps"], runs["wmrl"]["steps"], warmup)
    per_mode = lambda key: {m: r["summary"].get(key) for m, r in runs.items()}
    wm_runs = {m: r for m, r in runs.items() if m != "real"}
    precision = {m: eval_se_stats(c) for m, c in curves.items()}
    to_target = {
        m: None if target is None else time_to_target(c, target) for m, c in curves.items()
    }
    pretraining = (runs["wmrl"]["summary"].get("wm_pretraining_executions") or {}).get("total")
    ett = executions_to_target_ratio(curves, target, "wmrl", pretraining or 0)
    return {
        "time_to_target_ratio": ttt["ratio"],
        "time_to_target_note": ttt["note"],
        "time_to_target_reward": target,
        "time_to_target_s": to_target,
        # Real executions to the same target: RL's own, and counting wmrl's WM pretraining
        # executions (`wm_pretraining_executions`: None in a run saved before it was kept).
        "executions_to_target_ratio": ett["ratio"],
        "executions_to_target_ratio_with_pretraining": (
            ett["ratio_with_pretraining"] if pretraining is not None else None
        ),
        "executions_to_target": {
            m: None if target is None else executions_to_target(c, target)
            for m, c in curves.items()
        },
        "wm_pretraining_executions": {
            m: (r["summary"].get("wm_pretraining_executions") or {}).get("total")
            for m, r in wm_runs.items()
        },
        "final_heldout_reward": per_mode("final_heldout_reward"),
        "heldout_reward_at_equal_wall_clock": at_equal,
        # The noise of those single evaluations (SE counting the variance between tasks).
        "heldout_reward_se_at_equal_wall_clock": {
            m: se_at_wall_clock(c, t_equal) for m, c in curves.items()
        },
        "equal_wall_clock_s": t_equal,
        # The precision of every evaluation of the run (docs/method.md 6: SE <= 0.03 each).
        "heldout_reward_se_mean": {m: p["mean"] for m, p in precision.items()},
        "heldout_reward_se_max": {m: p["max"] for m, p in precision.items()},
        # Less noisy views of the same comparison (every evaluation up to t_equal counts):
        "heldout_reward_time_average": {
            m: time_average_reward(c, t_equal) for m, c in curves.items()
        },
        "heldout_reward_last3_at_equal_wall_clock": {
            m: recent_mean_reward(c, t_equal, 3) for m, c in curves.items()
        },
        "amdahl_bound": amd["amdahl_bound"],
        "amdahl_fraction_reached": amd["amdahl_fraction_reached"],
        "per_step_speedup": amd["per_step_speedup"],
        "amdahl": amd,
        "step_time_s": {m: mean_step_time(r["steps"], warmup) for m, r in runs.items()},
        "steps": per_mode("steps"),
        "wall_time_s": per_mode("wall_time_s"),
        "real_executions": per_mode("real_executions"),
        "wm_calls": per_mode("wm_calls"),
        "warmstart_heldout_reward": per_mode("warmstart_heldout_reward"),
        "best_heldout_reward": per_mode("best_heldout_reward"),
        # Multi-turn runs (None for single-turn ones): the held-out reward of turn 1 and of
        # the best of the K turns, their difference (does the agent use the feedback?) and
        # the fraction of episodes a later turn improves, at the warm start and at the end.
        **_turn_figures(runs),
        "static_check": {
            m: static_check_stats(r["pairs"], r["steps"]) for m, r in runs.items() if m != "real"
        },
        "wm_stream_within_group_corr": {
            m: within_group_correlation(r["pairs"]) for m, r in runs.items() if m != "real"
        },
        # The run's own per-step diagnostics (metrics.jsonl): the mean `wm_stream_corr` over
        # the steps where it is defined, and the anchor groups flattened over the run.
        "wm_stream_corr_mean": {
            m: _mean_defined(s.get("wm_stream_corr") for s in r["steps"])
            for m, r in wm_runs.items()
        },
        "wm_stream_collapsed_groups": {
            m: sum(s.get("wm_stream_collapsed_groups") or 0 for s in r["steps"])
            for m, r in wm_runs.items()
        },
        "curves": curves,
        "budget_s": budget_s,
        "config": _config_fields(config) if config is not None else None,
        "machine": machine(runs),
    }


def _turn_figures(runs: dict) -> dict:
    """Per mode, from each run's summary (`final_heldout_reward_by_turn`, a list: the best
    of the first t turns): `*_reward_turn1`, `*_reward_best_of_k`, `*_feedback_gain` (best of
    K - turn 1), for the warm start and the final policy, and the final policy's
    `final_heldout_improved_fraction`; every value None for a single-turn run."""
    out = {}
    for when in ("warmstart", "final"):
        by_turn = {m: r["summary"].get(f"{when}_heldout_reward_by_turn") for m, r in runs.items()}
        for fig, f in (
            ("reward_turn1", lambda v: v[0]),
            ("reward_best_of_k", lambda v: v[-1]),
            ("feedback_gain", lambda v: v[-1] - v[0]),
        ):
            out[f"{when}_heldout_{fig}"] = {
                m: None if v is None else f(v) for m, v in by_turn.items()
            }
    out["final_heldout_improved_fraction"] = {
        m: r["summary"].get("final_heldout_improved_fraction") for m, r in runs.items()
    }
    return out


def _mean_defined(values) -> float | None:
    v = [x for x in values if x is not None]
    return sum(v) / len(v) if v else None


def _mean_over_seeds(values: list):
    """The mean of one JSON value over seeds, leaf by leaf: numbers averaged (None if any
    seed has None: a mean that silently drops a seed that never reached a target would
    flatter it), dicts key by key, anything else the first seed's."""
    first = values[0]
    if isinstance(first, dict):
        return {k: _mean_over_seeds([v.get(k) if isinstance(v, dict) else None for v in values])
                for k in first}  # fmt: skip
    numeric = lambda v: isinstance(v, int | float) and not isinstance(v, bool)
    if numeric(first) or (first is None and any(numeric(v) for v in values)):
        return None if any(v is None for v in values) else sum(values) / len(values)
    return first


def over_seeds(results: list[dict]) -> dict:
    """`{figure: {mode: mean_ci95(per-seed values)}}` for the per-mode figures (plus the WM
    stream's within-group correlation on the anchors, `wm_stream_within_group_corr.stream`
    and `.raw_wm`) and `{figure: mean_ci95(...)}` for the one-number figures."""
    out = {}
    modes = results[0]["final_heldout_reward"]
    for fig in MODE_FIGURES:
        out[fig] = {m: mean_ci95([r[fig].get(m) for r in results]) for m in results[0][fig]}
    for part in ("stream", "raw_wm"):
        out[f"wm_stream_within_group_corr.{part}"] = {
            m: mean_ci95([(r["wm_stream_within_group_corr"].get(m) or {}).get(part)
                          for r in results])
            for m in results[0]["wm_stream_within_group_corr"] if m in modes
        }  # fmt: skip
    for fig in SCALAR_FIGURES:
        out[fig] = mean_ci95([r[fig] for r in results])
    return out


def paired(results: list[dict], mode: str = "wmrl") -> dict:
    """`{"<mode> - <other>": {figure: mean_ci95(per-seed differences)}}` for every other mode:
    each seed's difference between the two modes (same seed, same shared stages, the same
    equal wall-clock point), then the mean and 95% interval of those differences. A seed
    where either value is None gives None (left out of the mean, counted in `per_seed`)."""
    out = {}
    for other in results[0]["final_heldout_reward"]:
        if other == mode:
            continue
        diffs = {}
        for fig in PAIRED_FIGURES:
            d = []
            for r in results:
                a, b = r[fig].get(mode), r[fig].get(other)
                d.append(None if a is None or b is None else a - b)
            diffs[fig] = mean_ci95(d)
        out[f"{mode} - {other}"] = diffs
    return out


def aggregate(results: list[dict], seeds: list[int]) -> dict:
    """The benchmark's JSON from one `analyse` result per seed (same modes): the older keys
    hold the mean over seeds (`_mean_over_seeds`; one seed: its values unchanged), `curves`,
    `config`, `machine` the first seed's; plus `seeds`, `over_seeds`, `paired` and
    `per_seed` (every seed's own result, without config and machine)."""
    if len(results) != len(seeds) or not results:
        raise ValueError(f"{len(results)} results for seeds {seeds}")
    if len(results) == 1:
        out = dict(results[0])
    else:
        first = results[0]
        out = {
            k: first[k] if k in FIRST_SEED_KEYS else _mean_over_seeds([r.get(k) for r in results])
            for k in first
        }
        notes = [
            f"seed {s}: {r['time_to_target_note']}"
            for s, r in zip(seeds, results, strict=True)
            if r["time_to_target_note"]
        ]
        out["time_to_target_note"] = "; ".join(notes) or None
    out.pop("merged_from", None)  # a seed's own (per_seed), not the benchmark's
    out["seeds"] = list(seeds)
    out["over_seeds"] = over_seeds(results)
    out["paired"] = paired(results)
    out["per_seed"] = [
        {"seed": s, **{k: v for k, v in r.items() if k not in ("config", "machine")}}
        for s, r in zip(seeds, results, strict=True)
    ]
    return out


def stages_fingerprint(init_dir) -> dict | None:
    """`{stage: sha256 of its params}` for every stage under `init_dir` that saved params
    (the warm start, the pretrained WM), or None where there is none."""
    from etils import epath

    from wmrl.experiment import stages as xstages

    root = epath.Path(init_dir)
    if not root.is_dir():
        return None
    out = {
        d.name: xstages.params_digest(d)
        for d in sorted(root.iterdir(), key=lambda d: d.name)
        if d.is_dir() and xstages.has_params(d)
    }
    return out or None


def earlier_seeds(paths, config, budget_s, modes, seeds: int) -> dict[int, dict]:
    """`{seed index: result}` from earlier benchmark JSONs (`--merge`): each `per_seed` entry
    with its file's config and machine, checked against this benchmark (every field of
    `config_all`, or of `CONFIG_KEYS` for a JSON written before it, but the RL seed; the
    budget, the modes, the seed range); a mismatch or a seed two files both hold is a
    `ConfigError` naming `--merge` and the file."""
    from wmrl.config_errors import ConfigError

    # Compared on every field; a JSON written before `config_all`, on its `CONFIG_KEYS`.
    here_all, here_keys = config_all(config), json.loads(json.dumps(_config_fields(config)))
    first_seed = seeds_of(config, 1)[0]
    out = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError("--merge", f"{path}: not a readable benchmark JSON ({e})") from e
        if not isinstance(data, dict) or not isinstance(data.get("per_seed"), list):
            raise ConfigError("--merge", f"{path}: no 'per_seed' (not a speedup benchmark JSON)")
        if data.get("budget_s") != budget_s:
            raise ConfigError(
                "--merge", f"{path} ran --budget_s={data.get('budget_s')}, this one {budget_s}"
            )
        theirs = data.get("config") or {}
        older = "config_all" not in data
        there, here = (theirs, here_keys) if older else (data["config_all"], here_all)
        keys = sorted(set(there) | set(here))
        fields = [k for k in keys if k != "rl.seed" and there.get(k) != here.get(k)]
        if fields:
            diff = ", ".join(f"{k}: {there.get(k)!r} here {here.get(k)!r}" for k in fields)
            raise ConfigError("--merge", f"{path} ran another benchmark ({diff})")
        for entry in data["per_seed"]:
            index = entry["seed"] - first_seed
            if sorted(entry["final_heldout_reward"]) != sorted(modes):
                raise ConfigError(
                    "--merge", f"{path} seed {entry['seed']} ran modes "
                    f"{sorted(entry['final_heldout_reward'])}, this one {sorted(modes)}",
                )  # fmt: skip
            if not 0 <= index < seeds:
                raise ConfigError(
                    "--merge", f"{path} holds RL seed {entry['seed']}, outside --seeds={seeds}"
                )
            if index in out:
                raise ConfigError("--merge", f"RL seed {entry['seed']} is in two files")
            result = {k: v for k, v in entry.items() if k != "seed"}
            out[index] = {**result, "config": theirs, "machine": data.get("machine"),
                          "merged_from": str(path)}  # fmt: skip
    return out


def benchmark(config, workdir, modes=MODES, budget_s=None, steps=None, out=None,
              progress=True, log_to_files=False, seeds: int = 1,
              eval_samples: int | None = None, merge=()) -> dict:  # fmt: skip
    """Run (or resume, or reuse) the modes for each of `seeds` seeds, except those the earlier
    benchmark JSONs `merge` hold (`earlier_seeds`), then write the JSON and the plot; returns
    it. `eval_samples` overrides `rl.eval_samples` (the command line's `--eval_samples`,
    default `EVAL_SAMPLES`)."""
    from wmrl.autoresearch.config import validate_autoresearch_config

    workdir = Path(workdir)
    config = shared_config(config, workdir, budget_s, steps, eval_samples)
    validate_autoresearch_config(config)
    earlier = earlier_seeds(merge, config, budget_s, modes, seeds)
    timing = run_modes(config, workdir, modes, progress, log_to_files, seeds, skip=earlier)
    fingerprint = stages_fingerprint(config.init_dir) if len(earlier) < seeds else None
    results = [
        earlier[i] if i in earlier
        else {**analyse(load_runs(workdir, modes, i), config, budget_s),
              "stages_fingerprint": fingerprint}
        for i in range(seeds)
    ]  # fmt: skip
    result = aggregate(results, seeds_of(config, seeds))
    prints = {json.dumps(r.get("stages_fingerprint"), sort_keys=True) for r in results}
    result["config_all"] = config_all(config)
    result["stages_shared"] = len(prints) == 1
    result["merged"] = {
        "seeds": [s for i, s in enumerate(seeds_of(config, seeds)) if i in earlier],
        "from": sorted({r["merged_from"] for r in earlier.values()}),
        "machines": [r["machine"] for i, r in sorted(earlier.items())],
    }
    result["process_s"] = timing
    out = Path(out) if out else workdir / "speedup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)  # the plot's; nothing ran here if all merged
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot_curves(
        result["curves"], workdir / "speedup.png", result["time_to_target_reward"],
        more_seeds=[r["curves"] for r in results[1:]],
    )  # fmt: skip
    return result


# -- command line ----------------------------------------------------------------------------


def define_flags() -> dict:
    """The command-line flags, defined only when run as a program (importing this module from
    a notebook or a spawned mode process defines none, and loads no config file)."""
    return {
        "config": config_flags.DEFINE_config_file(
            "config", str(ROOT / "configs" / "autoresearch_tiny.py"), "AutoResearch config file."
        ),
        "workdir": flags.DEFINE_string(
            "workdir", None, "Benchmark directory (shared/, one dir per mode).", required=True
        ),
        "budget_s": flags.DEFINE_float(
            "budget_s", None, "Equal RL wall-clock budget for every mode (s)."
        ),
        "out": flags.DEFINE_string("out", None, "JSON output (default: <workdir>/speedup.json)."),
        "ablations": flags.DEFINE_bool(
            "ablations", False, "Also run wm_only, debias_only, denoise_only, permuted_wm."
        ),
        "modes": flags.DEFINE_list(
            "modes",
            None,
            "Exactly these modes (must include real and wmrl); overrides "
            "--ablations (e.g. real,wmrl,static_anchors,permuted_wm). Default: real, wmrl, "
            "static_anchors. Any mode as <mode>+cap (cost-aware routing, 2 s cap), "
            "<mode>+cap=S or <mode>+capq=Q (e.g. real+cap,wmrl+cap,static_anchors+cap).",
        ),
        "steps": flags.DEFINE_integer(
            "steps", None, "RL steps per mode (default: config rl.steps; with --budget_s: none)."
        ),
        "seeds": flags.DEFINE_integer(
            "seeds", 1, "Run every mode once per seed (RL seeds differ, shared stages once)."
        ),
        "merge": flags.DEFINE_list(
            "merge",
            [],
            "Earlier benchmark JSONs of this same benchmark: their seeds are taken from them "
            "(per_seed) instead of run again; only the other seeds of --seeds run.",
        ),
        "eval_samples": flags.DEFINE_integer(
            "eval_samples",
            EVAL_SAMPLES,
            "Scripts per held-out task in every evaluation (overrides rl.eval_samples; 0 keeps "
            "the config's). The default makes one evaluation's standard error ~0.03.",
        ),
    }


def main(argv, f: dict) -> None:
    del argv
    from wmrl.config_errors import ConfigError

    config, budget = f["config"].value, f["budget_s"].value
    workdir, out = f["workdir"].value, f["out"].value
    try:
        if config.get("experiment") != "autoresearch":
            raise ConfigError("config.experiment", "the speedup benchmark needs 'autoresearch'")
        if budget is not None and budget <= 0:
            raise ConfigError("--budget_s", f"must be > 0, got {budget}")
        seeds = f["seeds"].value
        if seeds < 1:
            raise ConfigError("--seeds", f"must be >= 1, got {seeds}")
        eval_samples = f["eval_samples"].value
        if eval_samples < 0:
            raise ConfigError("--eval_samples", f"must be >= 0, got {eval_samples}")
        modes = tuple(f["modes"].value or modes_for(f["ablations"].value))
        unknown = sorted(m for m in modes if not known_mode(m))
        if unknown or not {"real", "wmrl"} <= set(modes):
            raise ConfigError(
                "--modes",
                f"{list(modes)}: needs real and wmrl, modes of {list(ALL_MODES)}, "
                "each also as <mode>+cap, <mode>+cap=S or <mode>+capq=Q (cost-aware routing)",
            )
        result = benchmark(
            config, workdir, modes, budget, f["steps"].value, out, seeds=seeds,
            eval_samples=eval_samples or None, merge=f["merge"].value,
        )  # fmt: skip
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print()
    print(format_table(result))
    print(f"wrote {out or Path(workdir) / 'speedup.json'} and {Path(workdir) / 'speedup.png'}")


if __name__ == "__main__":
    _flags = define_flags()
    from wmrl.experiment.renamed import parse_flags

    app.run(lambda argv: main(argv, _flags), flags_parser=parse_flags)
