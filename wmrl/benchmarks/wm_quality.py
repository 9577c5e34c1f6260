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
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import model_setup, stages
from wmrl.benchmarks.common import machine

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
}  # fmt: skip
RUNTIME_FIGURES = ("runtime_spearman", "runtime_pearson", "timeout_auc", "timeouts")

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


def variant_config(config, overrides: dict):
    c = config.copy_and_resolve_references()
    for field, value in overrides.items():
        section, name = field.split(".")
        c[section][name] = value
    return c


def warm_started(config, prepared, warm_dir: Path):
    """(policy model, warm-started params) from `warm_dir/warmstart` (trained there once)."""
    vocab = model_setup.vocab_size(config, prepared.tokenizer)
    mesh = model_setup.make_rl_mesh(config)
    policy = model_setup.build_policy(config, vocab, model_setup.adam(1e-3), mesh, config.seed)
    params, _ = stages.warm_start(config, prepared, policy, warm_dir / "warmstart")
    return policy, params


def sampled(config, prepared, warm_dir: Path, samples_dir: Path, k: int):
    """The policy samples (records, report): k per training task from the warm start,
    executed once into `samples_dir/policy_samples` (reused when done)."""
    c = variant_config(config, {"wm.policy_samples_per_task": k})
    policy, params = warm_started(c, prepared, warm_dir)
    return stages.policy_samples(c, prepared, policy, params, samples_dir / stages.POLICY_SAMPLES)


def run_variant(
    config, prepared, workdir: Path, name: str, warm_dir: Path | None = None, samples=None
) -> dict:
    """Pretrain one variant's WM (its stage folder is reused when done); a WM trunk taken from
    the policy needs the warm start, built once into `warm_dir/warmstart` (default the
    workdir) for all variants. `samples`: policy samples, fitted on when the config's
    `wm.policy_samples_per_task` > 0, their held-out part reported either way."""
    vocab = model_setup.vocab_size(config, prepared.tokenizer)
    mesh = model_setup.make_rl_mesh(config)
    trunk = None
    if config.wm.trunk_from_policy:
        _, trunk = warm_started(config, prepared, warm_dir or workdir)
    wm = model_setup.build_wm(config, vocab, model_setup.adam(config.wm.online_learning_rate), mesh,
                         stages.wm_seed(config), trunk_params=trunk)  # fmt: skip
    stage_dir = workdir / name / "wm_pretrain"
    t0 = time.monotonic()
    _, report = stages.pretrain_wm(config, prepared, wm, stage_dir, progress=True, samples=samples)
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


def _cell(v) -> str:
    return "-" if v is None else str(v) if isinstance(v, int) else f"{v:.3f}"


def main(argv):
    del argv
    unknown = sorted(set(_VARIANTS.value) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"--variants: unknown {unknown}; one of {sorted(VARIANTS)}")
    from wmrl.autoresearch.experiment import quiet_orbax

    quiet_orbax()
    workdir = Path(_WORKDIR.value)
    config = _CONFIG.value
    data_dir = Path(_DATA_DIR.value) if _DATA_DIR.value else workdir / "data"
    if config.wm.validation_every == 0:
        config.wm.validation_every = 4  # new scripts of seen tasks: what the WM scores in RL
    prepared = rldata.prepare_data(config, data_dir, progress=True)
    warm_dir = Path(_INIT_DIR.value) if _INIT_DIR.value else workdir
    k = _POLICY_SAMPLES.value  # policy samples per training task
    results, samples, samples_report = {}, None, None
    if k > 0:  # one set of policy samples for every variant, with and without
        t0 = time.monotonic()
        samples, samples_report = sampled(config, prepared, warm_dir, workdir / f"k{k}", k)
        samples_report = {**samples_report, "wall_s": time.monotonic() - t0}
        samples_report.pop("config", None)
        print("policy samples: " + json.dumps(samples_report))
    for name in _VARIANTS.value:
        c = variant_config(config, VARIANTS[name])
        if k == 0:
            results[name] = run_variant(c, prepared, workdir, name, warm_dir)
            continue
        root = workdir / f"k{k}"  # the control too: its report holds these samples' figures
        results[name] = run_variant(c, prepared, root, name, warm_dir, samples)
        fit = variant_config(c, {"wm.policy_samples_per_task": k})
        results[f"{name}+fit"] = run_variant(fit, prepared, root, f"{name}+fit", warm_dir,
                                             samples)  # fmt: skip
    cols = (
        "validation_within_task_spearman", "heldout_within_task_spearman", "heldout_spearman",
        "heldout_rmse", "train_within_task_spearman", "pretrain_s",
    )  # fmt: skip
    if k > 0:
        cols = ("policy_within_task_spearman", "policy_val_tasks", "train_examples", *cols)
    print(f"WM quality after pretraining ({machine()})")
    print("| variant | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    for name, r in results.items():
        cells = [_cell(r[c]) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for name, r in results.items():
        figures = {f: v for f, v in r.items() if "runtime" in f or "timeout" in f or "raw" in f}
        if figures:
            print(f"{name} runtime head: " + json.dumps(figures))
    if _OUT.value:
        Path(_OUT.value).write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "variants": VARIANTS,
                    "policy_samples": samples_report,
                    "results": results,
                },
                indent=2,
            )
        )
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    flags.mark_flag_as_required("workdir")
    app.run(main)
