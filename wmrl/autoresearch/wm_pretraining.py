"""The world model's pretraining stage: its rows (the executed corpus of the training tasks,
single scripts or multi-turn episodes, and the fit part of the warm-started policy's executed
samples), training with a held-out split, and early stopping on the within-task ranking of
the rows it watches (`pretrain_wm`). The stage folder is `wm_pretrain` under `init_dir`
(`wmrl.autoresearch.stages`: fingerprint, Orbax params, `done.json` last).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from etils import epath
from tqdm import tqdm

from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import model_setup, pretrained
from wmrl.autoresearch.stages import (
    policy_sample_rows,
    prompt_buckets,
    save_params,
    split_policy_samples,
    stage_done,
    trim_prompts,
)  # fmt: skip
from wmrl.autoresearch.wm_metrics import predict_rows, within_task_spearman, wm_report
from wmrl.experiment import stages as xstages


def wm_rows(config, prepared, split: str) -> dict:
    tasks = prepared.train_tasks + prepared.heldout_tasks
    prompts = {t.id: rldata.task_prompt(config, t) for t in tasks}
    recs = [r for r in prepared.executions if r["split"] == split and r["task_id"] in prompts]
    rows = rldata.encode_trajectories(
        prepared.tokenizer, [prompts[r["task_id"]] for r in recs], [r["script"] for r in recs],
        config.data.max_prompt_len, config.data.max_new_tokens,
    )  # fmt: skip
    rows.update(rldata.reward_targets(recs))
    index = {t.id: i for i, t in enumerate(tasks)}
    rows["group"] = np.array([index[r["task_id"]] for r in recs], np.int32)
    rows["script_index"] = np.array([r["index"] for r in recs], np.int32)
    # The limit each script was executed under (the corpus runs with the tasks' own limits).
    limits = {t.id: rldata.time_limit(t) for t in tasks}
    rows["time_limit_s"] = np.array([limits[r["task_id"]] for r in recs], np.float32)
    if config.env.turns > 1 and split == "train" and prepared.episodes:
        rows = _concat(rows, episode_wm_rows(config, prepared, index, limits))
    return rows


def episode_wm_rows(config, prepared, index: dict, limits: dict) -> dict:
    """Multi-turn: every turn of the executed SFT episodes as a WM row, prompted with its
    real history (what the WM scores during RL) and with its real outcome's targets (reward,
    status, runtime, error type, validation metric)."""
    tok, width = prepared.tokenizer, config.data.max_prompt_len
    fits = lambda text: len(tok.encode(pretrained.prompt(config, text), add_bos=True)) <= width
    docs = rldata.episode_documents(config, prepared.episodes, prepared.episode_tasks, fits)
    recs = [
        {
            "task_id": rec["task_id"],
            "script": turn["script"],
            "status": turn["status"],
            "reward": turn["reward"],
            "runtime_s": turn["observation"]["runtime_s"],
            "error_type": turn["observation"]["error_type"],
            "validation": turn["observation"]["validation"],
        }
        for rec in prepared.episodes
        for turn in rec["turns"]
    ]  # in episode_documents' order
    rows = rldata.encode_trajectories(
        tok, [p for p, _ in docs], [s for _, s in docs], width, config.data.max_new_tokens
    )
    rows.update(rldata.reward_targets(recs))
    rows["group"] = np.array([index[r["task_id"]] for r in recs], np.int32)
    # Indices after the corpus's (wm.validation_every holds out by index).
    start = config.data.scripts_per_task
    rows["script_index"] = np.arange(start, start + len(recs), dtype=np.int32)
    rows["time_limit_s"] = np.array([limits[r["task_id"]] for r in recs], np.float32)
    return rows


def _concat(a: dict, b: dict) -> dict:
    return {k: np.concatenate([a[k], b[k]]) for k in a}


def split_validation(rows: dict, every: int) -> tuple[dict, dict | None]:
    """`(fit rows, validation rows)`: with `every` = k > 0 every k-th executed script of each
    training task is held out of pretraining, so the report can say how well the WM ranks
    *new scripts of seen tasks* (what it scores during RL) over many tasks, not only the few
    held-out tasks."""
    if every <= 0:
        return rows, None
    val = rows["script_index"] % every == every - 1
    return {k: v[~val] for k, v in rows.items()}, {k: v[val] for k, v in rows.items()}


def grouped_rows(rng: np.random.Generator, group: np.ndarray, batch: int, per_group: int):
    """A batch of row indices made of `batch // per_group` tasks x `per_group` of their rows
    (drawn with replacement), so the ranking loss sees scripts of one task side by side."""
    tasks = np.unique(group)
    picked = rng.choice(tasks, batch // per_group, replace=len(tasks) < batch // per_group)
    by_task = {t: np.nonzero(group == t)[0] for t in picked}
    return np.concatenate([rng.choice(by_task[t], per_group) for t in picked])


def pretrain_wm(
    config, prepared, wm: model_setup.Model, stage_dir: epath.Path, progress=True,
    samples: list[dict] | None = None, monitor=None,
):  # fmt: skip
    """Fit the WM on the executed corpus of the training tasks (and the fit part of the
    policy samples); report held-out calibration and ranking.

    `samples`: the policy samples' records (`policy_samples`). With
    `wm.policy_samples_per_task` > 0 their fit part (`split_policy_samples`) joins the
    pretraining rows; either way the report's `policy_validation` is the WM on their held-out
    part (with k = 0 the WM never saw a policy sample: the control of
    `wmrl.benchmarks.wm_quality`).

    `wm.pretrain_steps` is the most steps it trains. With `wm.pretrain_eval_every` = e > 0 it
    is trained to convergence instead: every e steps the within-task ranking of the rows
    early stopping watches (`stopping_rows`) is measured (`within_task_concordance`), the
    best parameters so far are kept, and training stops once `wm.pretrain_patience`
    measurements in a row have not improved on the best; the best parameters are the
    stage's. When the early-stopping rows are the held-out policy samples, the report's
    `policy_validation` is measured on the rows that chose the step (an optimistic figure:
    `wmrl.benchmarks.wm_quality` measures on policy samples of their own). `monitor`:
    `params -> dict` called at each of those measurements, its figures kept in the history
    under `monitor` (the benchmark's learning curves; nothing depends on them)."""
    report = stage_done(stage_dir, config)
    if report is not None:
        return xstages.load_params(stage_dir, wm.state.params), report
    from wmrl.models.train_steps import make_wm_score_fn

    train, held = wm_rows(config, prepared, "train"), wm_rows(config, prepared, "heldout")
    train, validation = split_validation(train, config.wm.validation_every)
    policy_fit, policy_val = None, None
    if samples:
        policy_fit, policy_val = split_policy_samples(
            config, policy_sample_rows(config, prepared, samples)
        )
        if config.wm.policy_samples_per_task > 0:
            train = _concat(train, policy_fit)
    n, bs, steps = len(train["tokens"]), config.wm.batch_size, config.wm.pretrain_steps
    m = wm.with_optimizer(
        model_setup.adam(config.wm.learning_rate, steps, warmup=max(steps // 20, 1))
    )
    rng = np.random.default_rng(wm_seed(config))
    coefs = model_setup.head_coefs(config)
    flags = model_setup.head_batch_flags(coefs)
    P = config.data.max_prompt_len
    batch = lambda idx, w=P: trim_prompts(
        model_setup.wm_batch(train, idx, rng, config.wm.num_members, **flags), P, w
    )
    # Multi-turn: batches of one prompt-width bucket (as the warm start's); single-turn: one
    # bucket of every row at full width, as before.
    buckets = prompt_buckets(train, P) if config.env.turns > 1 else [(P, np.arange(n))]
    steps_by_width = {
        w: model_setup.wm_step(m, batch(idx[np.arange(bs) % len(idx)], w), config.wm.rank_coef,
                          **coefs)
        for w, idx in buckets
    }  # fmt: skip
    share = np.array([len(idx) for _, idx in buckets], np.float64) / n
    score_fn = make_wm_score_fn(m.graphdef, m.shardings, m.mesh)
    watched, watched_name = stopping_rows(config, validation, policy_val)
    every = config.wm.pretrain_eval_every if watched is not None else 0
    watch = EarlyStopping(config.wm.pretrain_patience)
    state, t0, mse, best, history = m.state, time.monotonic(), float("nan"), None, []
    bar = tqdm(range(steps), desc="world model pretraining", disable=not progress)
    per_group, trained = config.wm.group_rows, 0
    for i in bar:
        j = rng.choice(len(buckets), p=share) if len(buckets) > 1 else 0
        width, rows_j = buckets[j]
        if per_group > 1:
            idx = rows_j[grouped_rows(rng, train["group"][rows_j], bs, per_group)]
        else:
            idx = rows_j[rng.integers(0, len(rows_j), bs)]
        state, metrics = steps_by_width[width](state, batch(idx, width))
        trained = i + 1
        if i % 10 == 0 or i == steps - 1:
            mse = float(metrics["mse"][0]) / max(float(metrics["mse"][1]), 1.0)
            bar.set_postfix(mse=f"{mse:.4f}")
        if every and trained % every == 0:
            figures = ranking_figures(score_fn, state.params, watched)
            if monitor is not None:
                figures["monitor"] = monitor(state.params)
            history.append({"step": trained, **figures})
            if watch.update(trained, figures["concordance"]):
                best = jax.tree.map(lambda x: x.copy(), state.params)  # the step donates
            bar.set_postfix(mse=f"{mse:.4f}", watched=f"{figures['concordance']}")
            if watch.stop:
                break
    params = state.params if best is None else best
    report = {
        "pretrain_steps": steps,
        "steps_trained": trained,
        "best_step": watch.best_step if best is not None else trained,
        "train_examples": n,
        "final_train_mse": mse,
        "heldout": wm_report(score_fn, params, held),
        "train": wm_report(score_fn, params, train, keep_scores=False),
        "time_s": time.monotonic() - t0,
    }
    if every:
        report["early_stopping"] = {
            "rows": watched_name, "n": int(watched["valid"].sum()), "every": every,
            "patience": watch.patience, "best_concordance": watch.best, "history": history,
        }  # fmt: skip
    if validation is not None:
        report["validation"] = wm_report(score_fn, params, validation, keep_scores=False)
    if policy_fit is not None:
        fitted = config.wm.policy_samples_per_task > 0
        report["policy_fit_examples"] = len(policy_fit["tokens"]) if fitted else 0
        if len(policy_val["tokens"]):
            report["policy_validation"] = wm_report(score_fn, params, policy_val, keep_scores=False)
    save_params(stage_dir, params, report, config)
    return params, report


def wm_seed(config) -> int:
    """The WM's initialisation and pretraining-batch seed: `wm.seed`, or `seed` + 1 when it
    is -1 (what every WM before the field used)."""
    return config.seed + 1 if config.wm.seed == -1 else config.wm.seed


def stopping_rows(config, validation: dict | None, policy_val: dict | None):
    """`(rows, name)` early stopping watches: the held-out policy samples when the WM is
    fitted on policy samples (`"policy_samples"`: new scripts of the policy, the rows it
    scores in RL), else the corpus validation split (`"corpus_validation"`,
    `wm.validation_every` > 0), else `(None, None)`: a fixed step count."""
    fitted = config.wm.policy_samples_per_task > 0
    if fitted and policy_val is not None and policy_val["valid"].any():
        return policy_val, "policy_samples"
    if validation is not None and validation["valid"].any():
        return validation, "corpus_validation"
    return None, None


def ranking_figures(score_fn, params, rows: dict) -> dict:
    """The WM on early-stopping rows: `concordance` (`within_task_concordance`, what
    early stopping maximises), the mean within-task Spearman and the score's mean squared
    error, over the graded rows."""
    keep = np.nonzero(rows["valid"])[0]
    s = predict_rows(score_fn, params, rows, keep)["score"]
    y, g = rows["target"][keep], rows["group"][keep]
    return {
        "concordance": within_task_concordance(s, y, g),
        "within_task_spearman": within_task_spearman(s, y, g)["mean"],
        "mse": float(np.mean((s - y) ** 2)),
    }


def within_task_concordance(scores, targets, group) -> float | None:
    """Of the pairs of one task's rows whose real rewards differ, pooled over tasks, the
    fraction the scores order the same way (a tie in score counts one half). The within-task
    order GRPO uses, averaged over pairs rather than over tasks: on a held-out split of a few
    rows per task it is steadier than the mean of per-task Spearman correlations (each +-1
    with two rows). None without such a pair."""
    scores, targets, group = (np.asarray(a) for a in (scores, targets, group))
    agree, pairs = 0.0, 0
    for g in np.unique(group):
        s, y = scores[group == g], targets[group == g]
        dy, ds = np.sign(y[:, None] - y[None, :]), np.sign(s[:, None] - s[None, :])
        upper = np.triu(np.ones(dy.shape, bool), 1) & (dy != 0)
        agree += float((ds * dy)[upper].clip(0).sum() + 0.5 * (ds[upper] == 0).sum())
        pairs += int(upper.sum())
    return agree / pairs if pairs else None


@dataclasses.dataclass
class EarlyStopping:
    """Keeps the best measurement (higher is better) and says when to stop: after `patience`
    measurements in a row without a new best (an undefined measurement, None, is none)."""

    patience: int
    best: float | None = None
    best_step: int = 0
    since_best: int = 0

    def update(self, step: int, value: float | None) -> bool:
        """Fold in the measurement at `step`; True when it is the new best."""
        if value is not None and (self.best is None or value > self.best):
            self.best, self.best_step, self.since_best = float(value), step, 0
            return True
        self.since_best += 1
        return False

    @property
    def stop(self) -> bool:
        return self.since_best >= self.patience
