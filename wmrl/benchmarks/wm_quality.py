"""World-model quality after pretraining, variant by variant, on one shared data stage.

GRPO uses only the differences between the scripts of one task, so the figure that matters
is the **within-task** Spearman correlation of WM score vs real reward (mean over tasks): on
new scripts of the training tasks (every 4th executed script of each is held out of
pretraining here, `wm.validation_every=4`: what the WM scores during RL, over 26 tasks) and
on the held-out tasks (only 3 in the tiny suite: a noisy figure). The pooled Spearman mostly
measures whether the WM knows which tasks are easy. Every variant pretrains from the same
data stage (built once, or reused from `--data_dir`) with the same seed; only the variant's
config fields differ.

    python -m wmrl.benchmarks.wm_quality --workdir=DIR [--data_dir=DIR/data] \
        [--variants=nll,rank] [--out=FILE.json]

Variants (`VARIANTS`): `nll` (Gaussian NLL + class CE on uniformly drawn rows, no runtime
head), `runtime` (+ the runtime head, `wm.runtime_coef=0.5`: the score is time-out aware under
each script's own time limit; also reports the runtime head's Spearman/Pearson vs the real log
runtime and the timeout AUC), `rank` (+ the within-task pairwise ranking loss on batches of
4 tasks x 4 scripts),
`rank_only_grouped` (grouped batches, no ranking loss: separates the two changes),
`policy_trunk` (the WM trunk is the warm-started policy: its width and weights; the warm
start is trained once, into `workdir/warmstart`), `policy_trunk_rank` (both), `default` (the
config as it is: the main job's WM).

Policy samples (`--policy_samples=K`, `wm.policy_samples_per_task`): K scripts per training
task sampled from the warm-started policy as RL samples and executed as RL executes, once,
into `workdir/kK/policy_samples` (the warm start from `--init_dir`, else trained into
`workdir/warmstart`). Every `wm.policy_validation_every`-th sample of each task (default 4)
is held out; each variant is then pretrained twice on the same data stage and the same
samples, without them (`NAME`, the control: the corpus only, as today) and with their fit
part (`NAME+fit`), and both report the within-task Spearman of WM score vs real reward on
the same held-out policy samples (`policy_within_task_spearman`: new scripts of the policy
itself, the rows the WM scores during RL), beside the validation and held-out figures:

    python -m wmrl.benchmarks.wm_quality --workdir=DIR --data_dir=SHARED/data \
        --init_dir=SHARED/init --variants=default --policy_samples=8 --out=FILE.json

The yardstick of the policy's own scripts (`--eval_samples=M`): M further scripts per
training task sampled from the warm start on a key stream of their own (`EVAL_STREAM`) and
executed once under the RL cap, into `workdir/evalM/policy_samples`; nothing trains or stops
early on them. Each task's samples make groups of `rl.group_size` (the anchors' layout), and
every scorer is measured on them with the anchor figures (`wmrl.autoresearch.anchor_metrics`:
within-group Spearman over all rows with the static check overriding what it decides, the
same without the override, over the rows it does not flag, among VALID rows; failure AUC
among unflagged rows; P(timeout) calibration). The scorers: the static check alone (one
constant elsewhere), the script-feature ridge (`wmrl.autoresearch.script_features`, fitted
on the corpus, and with `--policy_samples` also on the fit part of the policy samples) and
every WM variant, once per init seed of `--wm_seeds` (`wm.seed`; the figures' mean and 95%
interval over seeds). `--repeats=R` executes the yardstick R - 1 more times with other
execution keys (how deterministic the reward is: the ceiling of any scorer).

    python -m wmrl.benchmarks.wm_quality --workdir=DIR --policy_samples=8 --eval_samples=8 \
        --variants=default,long,converged --wm_seeds=0,1,2 --repeats=3 --out=FILE.json

With a yardstick, `--verdict=expected,sampled,expected+finetune,sampled+finetune` adds the
verdict WM (`wm.kind = "verdict"`, the warm-started policy's backbone, frozen or fine-tuned
before RL on the corpus and the fit part of `--policy_samples`; `wm.verdict_*` from
`--config`) as the scorers `verdict_SETTING`, each with the reference's fidelity figures
beside the anchor figures: the status accuracy of its top outcome and its bucket accuracy on
the real VALID scripts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from wmrl.autoresearch import anchor_metrics, model_setup, stages, wm_metrics, wm_pretraining
from wmrl.autoresearch import data as rldata
from wmrl.benchmarks.common import machine
from wmrl.experiment.config import set_fields
from wmrl.experiment.stats import mean_ci95

NO_RT = {"wm.runtime_coef": 0.0}
VARIANTS = {
    "nll": NO_RT,
    "runtime": {"wm.runtime_coef": 0.5},
    "rank": {**NO_RT, "wm.rank_coef": 1.0, "wm.group_rows": 4},
    "rank_only_grouped": {**NO_RT, "wm.group_rows": 4},
    "policy_trunk": {**NO_RT, "wm.trunk_from_policy": True},
    "policy_trunk_rank": {**NO_RT, "wm.trunk_from_policy": True, "wm.rank_coef": 1.0,
                          "wm.group_rows": 4},
    "default": {},
    # Trained longer: a fixed 1000 steps; to convergence: early stopping (at most 3000 steps).
    "long": {"wm.pretrain_steps": 1000, "wm.pretrain_eval_every": 0},
    "converged": {"wm.pretrain_steps": 3000, "wm.pretrain_eval_every": 50,
                  "wm.pretrain_patience": 6},
    # The learning curve: 2000 steps, measured every 100, never stopped early.
    "curve": {"wm.pretrain_steps": 2000, "wm.pretrain_eval_every": 100,
              "wm.pretrain_patience": 1000},
}  # fmt: skip
CURVE_FIGURES = ("stream_spearman", "learned_spearman", "failure_auc")
EVAL_STREAM = 23  # the yardstick's key stream (the fitted policy samples use POLICY_SAMPLES_KEY)
RUNTIME_FIGURES = ("runtime_spearman", "runtime_pearson", "timeout_auc", "timeouts")


def _define_flags() -> None:
    """The command's flags, defined when it runs (not on import: a test or notebook importing
    the yardstick's functions beside another absl command would define `--config` twice)."""
    global \
        _CONFIG, \
        _WORKDIR, \
        _DATA_DIR, \
        _VARIANTS, \
        _OUT, \
        _INIT_DIR, \
        _POLICY_SAMPLES, \
        _EVAL_SAMPLES, \
        _FIT_ONLY, \
        _WM_SEEDS, \
        _REPEATS, \
        _VERDICT
    _CONFIG = config_flags.DEFINE_config_file("config", "configs/autoresearch_tiny.py")
    _WORKDIR = flags.DEFINE_string("workdir", None, "Output folder (one sub-folder per variant).")
    _DATA_DIR = flags.DEFINE_string("data_dir", "", "Shared data stage ('' = <workdir>/data).")
    _VARIANTS = flags.DEFINE_list("variants", ["nll", "rank"], f"Of {sorted(VARIANTS)}.")
    _OUT = flags.DEFINE_string("out", "", "Write the figures as JSON here.")
    _INIT_DIR = flags.DEFINE_string(
        "init_dir", "", "Where the warm start is (or is built): '' = the workdir (warmstart/)."
    )
    _POLICY_SAMPLES = flags.DEFINE_integer(
        "policy_samples", 0,
        "K > 0: K policy samples per training task; every variant with and without them.",
    )  # fmt: skip
    _EVAL_SAMPLES = flags.DEFINE_integer(
        "eval_samples", 0, "M > 0: the yardstick, M policy samples per training task of their own."
    )
    _FIT_ONLY = flags.DEFINE_bool(
        "fit_only", False, "With --policy_samples: only the variants fitted on them (NAME+fit)."
    )
    _WM_SEEDS = flags.DEFINE_list("wm_seeds", [], "WM init seeds (wm.seed); [] = the config's.")
    _REPEATS = flags.DEFINE_integer(
        "repeats", 1, "R > 1: execute the yardstick R - 1 more times (determinism of the reward)."
    )
    _VERDICT = flags.DEFINE_list(
        "verdict", [], "With --eval_samples: the verdict WM's settings (VERDICT_SETTINGS)."
    )


def variant_config(config, overrides: dict):
    return set_fields(config.copy_and_resolve_references(), overrides)


def warm_started(config, prepared, warm_dir: Path):
    """(policy model, warm-started params) from `warm_dir/warmstart` (trained there once)."""
    vocab = model_setup.vocab_size(config, prepared.tokenizer)
    mesh = model_setup.make_rl_mesh(config)
    policy = model_setup.build_policy(config, vocab, model_setup.adam(1e-3), mesh, config.seed)
    params, _ = stages.warm_start(config, prepared, policy, warm_dir / "warmstart")
    return policy, params


def sampled(config, prepared, warm_dir: Path, samples_dir: Path, k: int, stream=None):
    """The policy samples (records, report): k per training task from the warm start,
    executed once into `samples_dir/policy_samples` (reused when done); `stream`: the key
    stream (default the stage's own)."""
    c = variant_config(config, {"wm.policy_samples_per_task": k})
    policy, params = warm_started(c, prepared, warm_dir)
    extra = {} if stream is None else {"stream": stream}
    return stages.policy_samples(
        c, prepared, policy, params, samples_dir / stages.POLICY_SAMPLES, **extra
    )


def yardstick(config, prepared, records: list[dict]) -> tuple[dict, list[dict]]:
    """The graded yardstick samples as WM rows (`stages.policy_sample_rows`) and as anchor
    pairs in the same order: groups of `rl.group_size` consecutive samples of one task, the
    static check's verdict (`rl.static_check`) on each script."""
    from wmrl.autoresearch.env.grader import Status, static_outcome

    G, check = config.rl.group_size, config.rl.static_check
    graded = [r for r in records if r["status"] != int(Status.UNGRADED)]
    rows = stages.policy_sample_rows(config, prepared, graded)
    order = {t.id: i for i, t in enumerate(prepared.train_tasks)}
    per_task = max(r["index"] for r in records) + 1
    pairs = []
    for r in graded:
        verdict = None
        if check != "off":
            got = static_outcome(r["script"].encode("utf-8", "surrogatepass"),
                                 names=check == "names")  # fmt: skip
            verdict = got[0].name if got is not None else None
        pairs.append({
            "step": order[r["task_id"]] * -(-per_task // G) + r["index"] // G + 1,
            "task_id": r["task_id"], "status": r["status"], "r_env": r["reward"],
            "static": verdict is not None, "static_status": verdict,
        })  # fmt: skip
    return rows, pairs


def scored(pairs: list[dict], scores, p_timeout=None) -> list[dict]:
    """The pairs with a scorer's score (`r_wm`) and, when it has one, its P(timeout)."""
    out = [{**p, "r_wm": float(s)} for p, s in zip(pairs, scores, strict=True)]
    if p_timeout is not None:
        for p, q in zip(out, p_timeout, strict=True):
            p["p_timeout"] = float(q)
    return out


def yardstick_figures(pairs: list[dict]) -> dict:
    """A scorer on the yardstick (pairs scored by `scored`): the anchor figures."""
    f = anchor_metrics.figures(pairs)
    alone = [{**p, "static": False, "static_status": None} for p in pairs]
    timeout = f["timeout_calibration"] or {}
    return {
        "stream_spearman": f["stream_spearman"]["mean"],
        "raw_spearman": anchor_metrics.stream_spearman(alone)["mean"],
        "learned_spearman": f["learned_spearman"]["mean"],
        "failure_auc": f["failure_auc"]["auc"],
        "valid_spearman": f["valid_spearman"]["mean"],
        "timeout_brier": timeout.get("brier"),
        "timeout_auc": timeout.get("auc"),
        "timeout_mean_p": timeout.get("mean_p"),
        "timeout_rate": timeout.get("rate"),
        "groups": f["stream_spearman"]["groups"],
        "learned_groups": f["learned_spearman"]["groups"],
    }


def feature_rows(config, prepared, records: list[dict], capped: bool) -> list:
    """Rows of the script-feature scorer: each graded record's script, its task's card
    facts under the limit it ran under (the task's own for the corpus, the RL cap for
    policy samples: `capped`) and its reward."""
    from wmrl.autoresearch import script_features as sf

    cap = config.suite.time_limit_s if capped else 0.0
    tasks = {t.id: t for t in prepared.train_tasks + prepared.heldout_tasks}
    facts = {}
    out = []
    for r in records:
        if r.get("reward") is None or r["task_id"] not in tasks:
            continue
        if r["task_id"] not in facts:
            facts[r["task_id"]] = sf.card_facts(tasks[r["task_id"]], cap)
        out.append(sf.Row(r["script"], facts[r["task_id"]], float(r["reward"])))
    return out


def ridge_figures(config, prepared, fit_records: list[dict], yard: list[dict], pairs) -> dict:
    """The script-feature ridge fitted on the training tasks' corpus and `fit_records`
    (policy samples), measured on the yardstick records `yard` (graded, in pairs' order)."""
    from wmrl.autoresearch import script_features as sf

    train_ids = {t.id for t in prepared.train_tasks}
    corpus = [r for r in prepared.executions if r["split"] == "train" and r["task_id"] in train_ids]
    rows = feature_rows(config, prepared, corpus, capped=False)
    rows += feature_rows(config, prepared, fit_records, capped=True)
    t0 = time.monotonic()
    scorer = sf.FeatureScorer().fit(rows)
    mean, _ = scorer.predict(feature_rows(config, prepared, yard, capped=True))
    return {**yardstick_figures(scored(pairs, mean)), "fit_rows": len(rows),
            "penalty": scorer.penalty, "fit_s": time.monotonic() - t0}  # fmt: skip


VERDICT_ROWS = 8  # rows per verdict call on the yardstick (one compiled shape)


VERDICT_SETTINGS = ("expected", "sampled", "expected+finetune", "sampled+finetune")


def verdict_figures(
    config, prepared, warm_dir: Path, yard: list[dict], pairs, setting: str, fit=(),
) -> dict:  # fmt: skip
    """The verdict WM (`setting`: its `wm.verdict_score`, `+finetune`: fine-tuned before RL
    on the training tasks' corpus and the policy samples `fit`, else frozen) on the
    yardstick records `yard` (graded, in pairs' order): the anchor figures of its score and
    the fidelity figures of its top outcome."""
    from wmrl.autoresearch.verdict_wm import VerdictWM, fidelity

    score, _, tuned = setting.partition("+")
    c = variant_config(config, {"wm.kind": "verdict", "wm.verdict_score": score,
                                "wm.verdict_train": tuned or "frozen"})  # fmt: skip
    policy, params = warm_started(c, prepared, warm_dir)
    lm = params if c.wm.verdict_from == "warm_start" else policy.state.params
    t0 = time.monotonic()
    wm = VerdictWM(c, prepared, lm, model_setup.vocab_size(c, prepared.tokenizer))
    if wm.trains:
        corpus = [r for r in prepared.executions if r["split"] == "train"]
        wm.finetune(corpus + list(fit), model_setup.make_rl_mesh(c))
    tasks = {t.id: t for t in prepared.train_tasks + prepared.heldout_tasks}
    got = wm.predict_in_chunks([r["script"] for r in yard],
                               [tasks[r["task_id"]] for r in yard], VERDICT_ROWS)  # fmt: skip
    return {**yardstick_figures(scored(pairs, got["score"])), **fidelity(got["top_outcome"], yard),
            "score_s": time.monotonic() - t0, "finetune": wm.finetune_report}  # fmt: skip


def repeat_figures(config, prepared, records: list[dict], pairs, out_dir: Path, repeats: int):
    """Execute the graded yardstick scripts `repeats` - 1 more times (execution keys of their
    own, journalled under `out_dir`): how often the reward is the same, the share of the
    within-group variance that is execution noise, and the within-group Spearman of one
    execution's rewards with another's (what any scorer could reach at best)."""
    from wmrl.autoresearch import evaluation
    from wmrl.autoresearch.anchors import open_journal
    from wmrl.autoresearch.env.executor import make_executor
    from wmrl.autoresearch.env.grader import Status

    graded = [r for r in records if r["status"] != int(Status.UNGRADED)]
    tasks = {t.id: t for t in prepared.train_tasks}
    row_tasks, scripts = [tasks[r["task_id"]] for r in graded], [r["script"] for r in graded]
    rewards = [np.array([r["reward"] for r in graded], float)]
    out_dir.mkdir(parents=True, exist_ok=True)
    journal = open_journal(out_dir, "repeats")
    try:
        with make_executor(config.suite, seed=config.seed) as pool:
            for k in range(1, repeats):
                got = evaluation.execute_scripts(
                    pool, journal, k, row_tasks, scripts, kind=f"repeat{k}"
                )  # fmt: skip
                rewards.append(np.where(np.isnan(got["reward"]), np.nan, got["reward"]))
    finally:
        journal.close()
    R = np.stack(rewards)  # [repeats, n]
    ok = ~np.isnan(R).any(axis=0)
    same = ok & (np.ptp(np.where(np.isnan(R), 0, R), axis=0) == 0)
    noise = float(np.mean(np.var(R[:, ok], axis=0, ddof=1)))
    within = anchor_metrics.variance_shares([p for p, k in zip(pairs, ok, strict=True) if k])
    n_ok = max(int(ok.sum()) - len(anchor_metrics.groups(pairs)), 1)
    retest = anchor_metrics.stream_spearman(
        [{**p, "r_wm": float(R[1, i]), "static": False, "static_status": None}
         for i, p in enumerate(pairs) if ok[i]]
    )["mean"]  # fmt: skip
    differ = [
        {"task_id": graded[i]["task_id"], "rewards": R[:, i].tolist()}
        for i in np.nonzero(ok & ~same)[0]
    ]
    return {
        "scripts": len(graded), "executed_every_time": int(ok.sum()), "identical": int(same.sum()),
        "noise_var": noise, "within_group_var": within["total"] / n_ok,
        "noise_share": noise / (within["total"] / n_ok) if within["total"] else None,
        "retest_spearman": retest, "differing": differ,
    }  # fmt: skip


def run_variant(
    config, prepared, workdir: Path, name: str, warm_dir: Path | None = None, samples=None,
    yard=None,
) -> dict:  # fmt: skip
    """Pretrain one variant's WM (its stage folder is reused when done); a WM trunk taken from
    the policy needs the warm start, built once into `warm_dir/warmstart` (default the
    workdir) for all variants. `samples`: policy samples, fitted on when the config's
    `wm.policy_samples_per_task` > 0, their held-out part reported either way. `yard`: the
    yardstick's (rows, pairs), the WM's figures on it under `yardstick`."""
    vocab = model_setup.vocab_size(config, prepared.tokenizer)
    mesh = model_setup.make_rl_mesh(config)
    trunk = None
    if config.wm.trunk_from_policy:
        _, trunk = warm_started(config, prepared, warm_dir or workdir)
    wm = model_setup.build_wm(config, vocab, model_setup.adam(config.wm.online_learning_rate), mesh,
                         wm_pretraining.wm_seed(config), trunk_params=trunk)  # fmt: skip
    stage_dir = workdir / name / "wm_pretrain"
    t0 = time.monotonic()
    on_yard = None
    if yard is not None:
        from wmrl.models.train_steps import make_wm_score_fn

        rows, pairs = yard
        score_fn = make_wm_score_fn(wm.graphdef, wm.shardings, wm.mesh)

        def on_yard(params) -> dict:
            pred = wm_metrics.predict_rows(score_fn, params, rows, np.arange(len(rows["tokens"])))
            return yardstick_figures(scored(pairs, pred["score"], pred.get("p_timeout")))

    params, report = wm_pretraining.pretrain_wm(
        config, prepared, wm, stage_dir, progress=True, samples=samples, monitor=on_yard
    )
    extra = {}
    if on_yard is not None:
        extra["yardstick"] = on_yard(params)
        history = report.get("early_stopping", {}).get("history", [])
        extra["curve"] = [
            {"step": h["step"], "concordance": h["concordance"], "mse": h["mse"],
             **{f"yard_{k}": h.get("monitor", {}).get(k) for k in CURVE_FIGURES}}
            for h in history
        ]  # fmt: skip
    held, train, val = report["heldout"], report.get("train", {}), report.get("validation", {})
    pol = report.get("policy_validation", {}).get("within_task_spearman", {})
    runtime = {}
    if "timeout_auc" in val or "timeout_auc" in held:
        raw = lambda r: r.get("within_task_spearman_raw", {}).get("mean")
        runtime = {
            "validation_within_task_spearman_raw": raw(val),
            "heldout_within_task_spearman_raw": raw(held),
            **{f"validation_{k}": val.get(k) for k in RUNTIME_FIGURES},
            **{f"heldout_{k}": held.get(k) for k in RUNTIME_FIGURES},
        }
    return {
        **runtime,
        **extra,
        "steps_trained": report.get("steps_trained", report["pretrain_steps"]),
        "best_step": report.get("best_step"),
        "policy_within_task_spearman": pol.get("mean"),
        "policy_val_tasks": pol.get("tasks"),
        "policy_val_rows": report.get("policy_validation", {}).get("n"),
        "policy_fit_examples": report.get("policy_fit_examples"),
        "train_examples": report["train_examples"],
        "validation_within_task_spearman": val.get("within_task_spearman", {}).get("mean"),
        "validation_tasks": val.get("within_task_spearman", {}).get("tasks"),
        "validation_spearman": val.get("spearman"),
        "heldout_within_task_spearman": held["within_task_spearman"]["mean"],
        "heldout_tasks": held["within_task_spearman"]["tasks"],
        "heldout_spearman": held["spearman"],
        "heldout_rmse": held["rmse"],
        "heldout_ece": held["ece"],
        "train_within_task_spearman": train.get("within_task_spearman", {}).get("mean"),
        "pretrain_s": report["time_s"],
        "wall_s": time.monotonic() - t0,
    }


def main(argv):
    del argv
    unknown = sorted(set(_VARIANTS.value) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"--variants: unknown {unknown}; one of {sorted(VARIANTS)}")
    if sorted(set(_VERDICT.value) - set(VERDICT_SETTINGS)):
        raise app.UsageError(f"--verdict: {_VERDICT.value}; of {', '.join(VERDICT_SETTINGS)}")
    if _VERDICT.value and _EVAL_SAMPLES.value <= 0:
        raise app.UsageError("--verdict needs the yardstick (--eval_samples > 0)")
    from wmrl.autoresearch.experiment import quiet_orbax

    quiet_orbax()
    workdir = Path(_WORKDIR.value)
    config = _CONFIG.value
    data_dir = Path(_DATA_DIR.value) if _DATA_DIR.value else workdir / "data"
    if config.wm.validation_every == 0:
        config.wm.validation_every = 4  # new scripts of seen tasks: what the WM scores in RL
    prepared = rldata.prepare_data(config, data_dir, progress=True)
    warm_dir = Path(_INIT_DIR.value) if _INIT_DIR.value else workdir
    k, m = _POLICY_SAMPLES.value, _EVAL_SAMPLES.value  # per training task
    results, samples, samples_report, yard, out = {}, None, None, None, {}
    if k > 0:  # one set of policy samples for every variant, with and without
        t0 = time.monotonic()
        samples, samples_report = sampled(config, prepared, warm_dir, workdir / f"k{k}", k)
        samples_report = {**samples_report, "wall_s": time.monotonic() - t0}
        samples_report.pop("config", None)
        print("policy samples: " + json.dumps(samples_report))
    if m > 0:  # the yardstick: policy samples of its own stream, never trained on
        t0 = time.monotonic()
        records, report = sampled(config, prepared, warm_dir, workdir / f"eval{m}", m, EVAL_STREAM)
        out["yardstick"] = {**{k: v for k, v in report.items() if k != "config"},
                            "wall_s": time.monotonic() - t0}  # fmt: skip
        yard = yardstick(config, prepared, records)
        graded = [r for r in records if r["reward"] is not None]
        out["variance_shares"] = anchor_metrics.variance_shares(yard[1])
        out["scorers"] = {
            "static_alone": yardstick_figures(scored(yard[1], np.full(len(yard[1]), 0.5))),
            "ridge": ridge_figures(config, prepared, [], graded, yard[1]),
        }
        if samples:
            every = config.wm.policy_validation_every  # the fit part, as the WM's
            fit = [r for r in samples if every == 0 or r["index"] % every != every - 1]
            out["scorers"]["ridge+fit"] = ridge_figures(config, prepared, fit, graded, yard[1])
        for setting in _VERDICT.value:
            every = config.wm.policy_validation_every  # the fit part, as the WM's
            fit = [r for r in samples or [] if every == 0 or r["index"] % every != every - 1]
            out["scorers"][f"verdict_{setting}"] = verdict_figures(
                config, prepared, warm_dir, graded, yard[1], setting, fit
            )
        if _REPEATS.value > 1:
            repeats_dir = workdir / f"eval{m}" / "repeats"
            out["repeats"] = repeat_figures(
                config, prepared, records, yard[1], repeats_dir, _REPEATS.value
            )
            brief = {k: v for k, v in out["repeats"].items() if k != "differing"}
            print("repeats: " + json.dumps(brief))
        print("yardstick: " + json.dumps(out["yardstick"]))
    seeds = [int(v) for v in _WM_SEEDS.value] or [None]
    for name in _VARIANTS.value:
        for fitted in ((True,) if _FIT_ONLY.value else (False, True)) if k > 0 else (False,):
            c = variant_config(config, VARIANTS[name])
            label = name
            if fitted:
                c, label = variant_config(c, {"wm.policy_samples_per_task": k}), f"{name}+fit"
            per_seed = []
            for seed in seeds:
                cs = c if seed is None else variant_config(c, {"wm.seed": seed})
                root = workdir / f"k{k}" if k > 0 else workdir  # the control's report too
                sub = label if seed is None else f"{label}/seed{seed}"
                per_seed.append(run_variant(cs, prepared, root, sub, warm_dir, samples, yard))
            results[label] = per_seed[0] if seeds == [None] else {"seeds": seeds, "runs": per_seed}
    print_tables(results, out, k)
    if _OUT.value:
        Path(_OUT.value).write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "variants": VARIANTS,
                    "policy_samples": samples_report,
                    **out,
                    "results": results,
                },
                indent=2,
            )
        )
        print(f"wrote {_OUT.value}")


YARD_COLS = ("stream_spearman", "raw_spearman", "learned_spearman", "failure_auc",
             "valid_spearman", "timeout_brier", "timeout_auc", "status_accuracy",
             "bucket_accuracy")  # fmt: skip


def _interval(values) -> str:
    s = mean_ci95(values)
    if s["mean"] is None:
        return "-"
    if s["ci95"] is None:
        return f"{s['mean']:.3f}"
    return f"{s['mean']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]"


def print_tables(results: dict, out: dict, k: int) -> None:
    """The pretraining figures per variant and, with a yardstick, every scorer on it (WM
    variants: mean and 95% interval over the init seeds)."""
    cols = (
        "validation_within_task_spearman", "heldout_within_task_spearman", "heldout_spearman",
        "heldout_rmse", "train_within_task_spearman", "pretrain_s", "steps_trained",
    )  # fmt: skip
    if k > 0:
        cols = ("policy_within_task_spearman", "policy_val_tasks", "train_examples", *cols)
    runs = {n: r.get("runs", [r]) for n, r in results.items()}
    print(f"WM quality after pretraining ({machine()})")
    print("| variant | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, rs in runs.items():
        cells = [_interval([r[c] for r in rs]) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name, rs in runs.items():
        figures = {f: v for f, v in rs[0].items() if "runtime" in f or "timeout" in f or "raw" in f}
        if figures:
            print(f"{name} runtime head (first seed): " + json.dumps(figures))
    if "scorers" not in out:
        return
    print("\nOn the yardstick (held-out executed policy samples, groups of the RL group size)")
    print("| scorer | " + " | ".join(YARD_COLS) + " |")
    print("|---" * (len(YARD_COLS) + 1) + "|")
    table = {n: [f] for n, f in out["scorers"].items()}
    for name, rs in runs.items():
        if "yardstick" in rs[0]:
            table[name] = [r["yardstick"] for r in rs]
    for name, fs in table.items():
        cells = (_interval([f.get(c) for f in fs]) for c in YARD_COLS)
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    _define_flags()
    flags.mark_flag_as_required("workdir")
    from wmrl.experiment.renamed import parse_flags

    app.run(main, flags_parser=parse_flags)
