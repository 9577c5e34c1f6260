"""Stages before RL: warm start (SFT) and world-model pretraining, each saved once and reused.

The stage folders are the shared ones (`wmrl.experiment.stages`): a stage writes its
parameters with Orbax under `<init_dir>/<stage>/params` and then, last,
`<init_dir>/<stage>/done.json` with its report and config fingerprint; a stage whose
`done.json` exists is loaded instead of retrained, so an interrupted pipeline redoes at most
the stage it was in, and one made with another config is refused, naming the fields.
`init_dir` may be a local folder or an epath URL such as gs://BUCKET/PATH.

With several JAX processes every process trains and saves together (Orbax is collective);
process 0 alone clears the stage folder and writes `done.json`, between barriers.
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np
from etils import epath
from tqdm import tqdm

from wmrl import distributed
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import model_setup, pretrained
from wmrl.autoresearch.config import HISTORY
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import ERROR_TYPES
from wmrl.autoresearch.env.suite import SUITE_VERSION
from wmrl.autoresearch.wm_metrics import predict_rows, within_task_spearman, wm_report
from wmrl.config_errors import ConfigError
from wmrl.experiment import stages as xstages
from wmrl.jsonl import read_jsonl

# What each stage's output depends on (dotted config fields; a section means all of it).
_WARMSTART = ("seed", "suite.dir", "suite.tasks", "data", "policy", "pretrained")
STAGE_FIELDS = {
    "warmstart": _WARMSTART,
    # The warm-started policy's scripts, sampled as RL samples and executed as RL executes.
    "policy_samples": (
        *_WARMSTART, "wm.policy_samples_per_task", "rl.temperature", "suite.time_limit_s",
    ),
    "wm_pretrain": (
        "seed", "suite.dir", "suite.tasks", "data", "pretrained", "wm.d_model", "wm.num_layers",
        "wm.mlp_dim", "wm.head_dim", "wm.num_members", "wm.pretrain_steps", "wm.batch_size",
        "wm.learning_rate", "wm.rank_coef", "wm.runtime_coef", "wm.error_type_coef",
        "wm.validation_coef", "wm.group_rows",
        "wm.trunk_from_policy", "wm.validation_every", "policy",
        "wm.policy_samples_per_task", "wm.policy_validation_every", "wm.seed",
        "wm.pretrain_eval_every", "wm.pretrain_patience",
    ),
}  # fmt: skip
POLICY_SAMPLES = "policy_samples"
POLICY_SAMPLES_KEY = 17  # folded into jax.random.key(seed): the policy samples' stream


def active_stages(config) -> tuple[str, ...]:
    """The stages before RL this config runs (the policy samples only with
    `wm.policy_samples_per_task` > 0; no neural pretraining for `wm.kind = "features"`,
    whose scorer is fitted when RL starts)."""
    skip = () if config.wm.policy_samples_per_task > 0 else (POLICY_SAMPLES,)
    if config.wm.kind == "features":
        skip = (*skip, "wm_pretrain")
    return tuple(s for s in STAGE_FIELDS if s not in skip)


def stages_done(config, init_dir) -> bool:
    """Whether every stage before RL (the warm start, the policy samples when configured and
    the WM pretraining, written after the data stage) has completed under `init_dir` with
    this config."""
    return all(_done(epath.Path(init_dir) / s, config) is not None for s in active_stages(config))


def _fingerprint(config, stage: str) -> dict:
    out = xstages.config_fields(config, STAGE_FIELDS[stage])
    if not config.suite.dir:  # built-in tasks: their rows are the builder's version's
        out["suite_version"] = SUITE_VERSION
    if config.env.turns > 1:  # multi-turn stages train on episodes; single-turn ones as before
        out["env"] = config.env.to_dict()
    return out


def _done(stage_dir: epath.Path, config) -> dict | None:
    """The stage's report if it completed with this config; a stage made with another config
    is an error naming the fields (loading it would fail on shapes, or silently differ)."""
    stage_dir = epath.Path(stage_dir)
    return xstages.done(stage_dir, HISTORY, _fingerprint(config, stage_dir.name))


def save_params(stage_dir: epath.Path, params, report: dict, config) -> None:
    """A finished parameter stage: the folder cleared (a half-written earlier attempt), the
    params saved with Orbax, then `done.json`."""
    stage_dir = xstages.begin(stage_dir)
    xstages.save_params(stage_dir, params)
    xstages.finish(stage_dir, report, _fingerprint(config, stage_dir.name))


def load_params(stage_dir: epath.Path, like):
    """Restore params into the shardings of `like` (an abstract or concrete params tree)."""
    return xstages.load_params(stage_dir, like)


def sft_rows(config, prepared: rldata.Prepared) -> dict:
    """SFT examples (training tasks only) that fit the context; see `data.sft_documents`.
    Multi-turn (env.turns > 1): also every turn of the executed SFT episodes, prompted with
    their real history (`data.episode_documents`), so the policy learns to read an
    observation and fix or keep its script."""
    docs = rldata.sft_documents(config, prepared.train_tasks, prepared.episode_tasks)
    if config.env.turns > 1:
        tok, width = prepared.tokenizer, config.data.max_prompt_len
        fits = lambda text: len(tok.encode(pretrained.prompt(config, text), add_bos=True)) <= width
        docs += rldata.episode_documents(
            config, prepared.episodes, prepared.episode_tasks, fits
        )  # fmt: skip
    rows = rldata.encode_trajectories(
        prepared.tokenizer, [p for p, _ in docs], [s for _, s in docs],
        config.data.max_prompt_len, config.data.max_new_tokens,
    )  # fmt: skip
    keep = rows["fits"]
    if not keep.any():
        raise ConfigError(
            "config.data.max_new_tokens",
            f"no warm-start script fits in {config.data.max_new_tokens} tokens",
        )
    return {k: v[keep] for k, v in rows.items() if k != "fits"}


def prompt_buckets(rows: dict, width: int, multiple: int = 32) -> list[tuple[int, np.ndarray]]:
    """Multi-turn rows by the prompt width they need: `[(narrow width, their indices), (width,
    the rest)]`, or one bucket of every row when no row (or every row) is short.

    A multi-turn prompt budget (`data.max_prompt_len`) is sized for a history, but most
    warm-start and WM-pretraining rows are turn-1 rows (the card alone, a few dozen tokens):
    padded to the full width they cost several times their own compute. Rows whose prompt
    fits half the width go to the narrow bucket, whose width is their longest prompt rounded
    up to `multiple` (every row, if all of them fit it). A row trimmed to its bucket
    (`trim_prompts`) gives the same loss and WM outputs as at full width: positions come from
    the padding mask and padding is masked out of attention and of the WM's pooling (up to
    float rounding)."""
    need = rows["input_mask"][:, :width].sum(axis=1)
    short = need <= width // 2
    if not short.any():
        return [(width, np.arange(len(need)))]
    narrow = min(width, -(-int(need[short].max()) // multiple) * multiple)
    short = need <= narrow
    if short.all():
        return [(narrow, np.arange(len(need)))]
    return [(narrow, np.nonzero(short)[0]), (width, np.nonzero(~short)[0])]


def trim_prompts(rows: dict, width: int, keep: int) -> dict:
    """Rows in the shared layout with their left-padded prompt cut to its last `keep` of
    `width` columns (every `[n, width + new]` array; the others unchanged)."""
    if keep == width:
        return rows
    total = next(v.shape[1] for k, v in rows.items() if k == "tokens")
    cut = width - keep
    return {k: v[:, cut:] if v.ndim == 2 and v.shape[1] == total else v for k, v in rows.items()}


def bucket_batches(rng: np.random.Generator, buckets: list[tuple[int, np.ndarray]], bs: int):
    """Endless `(width, row indices [bs])` SFT batches: epochs of reshuffled rows of each
    bucket, a batch's bucket drawn with probability proportional to the bucket's size. With
    one bucket, exactly the single-turn order (epochs of `rng.permutation(n)`)."""
    share = np.array([len(idx) for _, idx in buckets], np.float64)
    share /= share.sum()
    orders = [np.zeros(0, np.int64) for _ in buckets]
    while True:
        j = rng.choice(len(buckets), p=share) if len(buckets) > 1 else 0
        width, idx = buckets[j]
        while len(orders[j]) < bs:
            orders[j] = np.concatenate([orders[j], idx[rng.permutation(len(idx))]])
        batch, orders[j] = orders[j][:bs], orders[j][bs:]
        yield width, batch


def warm_start(config, prepared, policy: model_setup.Model, stage_dir: epath.Path, progress=True):
    """SFT the policy on the corpus; returns (policy params, report)."""
    report = _done(stage_dir, config)
    if report is not None:
        return load_params(stage_dir, policy.state.params), report
    if config.policy.sft_steps == 0:  # RL straight from the initial (e.g. pretrained) policy
        return policy.state.params, {"sft_steps": 0, "sft_examples": 0, "final_nll": None}
    rows = sft_rows(config, prepared)
    n, bs = len(rows["tokens"]), config.policy.sft_batch_size
    steps = config.policy.sft_steps
    tx = model_setup.adam(config.policy.sft_learning_rate, steps, warmup=max(steps // 20, 1))
    m = policy.with_optimizer(tx)
    rng = np.random.default_rng(config.seed)
    P = config.data.max_prompt_len
    # Multi-turn: batches of one prompt-width bucket (`prompt_buckets`), each row trimmed to
    # its bucket's width; single-turn: one bucket of every row, at full width, as before.
    buckets = prompt_buckets(rows, P) if config.env.turns > 1 else [(P, np.arange(n))]
    steps_by_width = {
        w: model_setup.sft_step(
            m, trim_prompts({k: v[idx[np.arange(bs) % len(idx)]] for k, v in rows.items()}, P, w),
            prompt_width=w,
        )
        for w, idx in buckets
    }  # fmt: skip
    state, t0, nll = m.state, time.monotonic(), float("nan")
    batches = bucket_batches(rng, buckets, bs)
    bar = tqdm(range(steps), desc="warm start (SFT)", disable=not progress)
    for i in bar:
        width, idx = next(batches)
        b = trim_prompts({k: v[idx] for k, v in rows.items()}, P, width)
        state, metrics = steps_by_width[width](state, b)
        if i % 10 == 0 or i == steps - 1:
            s, c = metrics["nll"]
            nll = float(s) / max(float(c), 1.0)
            bar.set_postfix(nll=f"{nll:.3f}")
    report = {"sft_steps": steps, "sft_examples": n, "final_nll": nll,
              "time_s": time.monotonic() - t0}  # fmt: skip
    save_params(stage_dir, state.params, report, config)
    return state.params, report


SAMPLES_FILE = "samples.jsonl"  # the policy samples' records, written before done.json
SAMPLES_STARTED = "started.json"  # the fingerprint an unfinished policy-sample stage ran with


def policy_samples(
    config, prepared, policy: model_setup.Model, params, stage_dir, progress=True,
    stream: int = POLICY_SAMPLES_KEY,
):  # fmt: skip
    """`wm.policy_samples_per_task` = k scripts per training task from the warm-started
    policy, sampled with RL's settings (its prompt, `rl.temperature`, `data.max_new_tokens`)
    and executed for real in the sandbox pool as the RL anchors are (each task's limit capped
    by `suite.time_limit_s`, the grader's outcome), by the held-out evaluation's sampler and
    executor (`evaluation.generate_rows`, `evaluation.execute_scripts`). Returns (records,
    report); k = 0: ([], None), nothing sampled or written. `stream` is folded into the
    seed's key: another value draws other scripts (`wmrl.benchmarks.wm_quality` samples its
    yardstick so), and a cached stage drawn from another stream is an error.

    The WM pretraining fits on them (`policy_sample_rows`): it then sees the distribution it
    scores during RL, not only the authored corpus. Cached under `stage_dir` (`samples.jsonl`,
    then `done.json` last); every execution is journalled as it completes
    (`executions.jsonl`), so an interrupted stage samples the same scripts again (same key)
    and reuses what it had executed. Sampling is collective over the JAX processes; each
    executes its round-robin share on its own pool; process 0 writes the files."""
    k = config.wm.policy_samples_per_task
    if k == 0:
        return [], None
    stage_dir = epath.Path(stage_dir)
    report = _done(stage_dir, config)
    if report is not None:
        if report.get("stream", POLICY_SAMPLES_KEY) != stream:
            raise ConfigError(
                "policy_samples",
                f"{stage_dir} holds samples of key stream {report.get('stream')}, not {stream}",
            )
        return read_jsonl(stage_dir / SAMPLES_FILE), report
    from wmrl.autoresearch import evaluation
    from wmrl.autoresearch.anchors import open_journal
    from wmrl.autoresearch.env.executor import make_executor

    fingerprint = _fingerprint(config, POLICY_SAMPLES)
    if stream != POLICY_SAMPLES_KEY:
        fingerprint["stream"] = stream  # an unfinished stage of another stream starts over
    started = stage_dir / SAMPLES_STARTED
    if distributed.is_main_process():
        stale = started.exists() and json.loads(started.read_text()) != fingerprint
        if stale or (stage_dir.exists() and not started.exists()):
            stage_dir.rmtree()  # an attempt with other settings: its executions do not apply
        stage_dir.mkdir(parents=True, exist_ok=True)
        started.write_text(json.dumps(fingerprint, indent=2))
    distributed.barrier(f"{POLICY_SAMPLES} started")
    t0 = time.monotonic()
    tasks, tok = prepared.train_tasks, prepared.tokenizer
    if progress:
        print(f"policy samples: {k} per training task x {len(tasks)} tasks", flush=True)
    prompts = [rldata.task_prompt(config, t) for t in tasks]
    sc = evaluation.rl_sampling(config, tok, k)
    key = jax.random.fold_in(jax.random.key(config.seed), stream)
    rows, scripts = evaluation.generate_rows(
        policy.graphdef, params, tok, prompts, config.data.max_prompt_len, sc, key,
        model_setup.seq_len(config),
    )  # fmt: skip
    sample_s = time.monotonic() - t0
    row_tasks = [t for t in tasks for _ in range(k)]
    journal = open_journal(stage_dir, "executions")
    try:
        with make_executor(config.suite, seed=config.seed) as pool:
            out = evaluation.execute_scripts(
                pool, journal, 0, row_tasks, scripts, kind=POLICY_SAMPLES
            )
    finally:
        journal.close()
    P = config.data.max_prompt_len
    records = []
    for i, (task, script) in enumerate(zip(row_tasks, scripts, strict=True)):
        graded = out["status"][i] != int(Status.UNGRADED)
        err = int(out["error_type"][i])
        records.append({
            "task_id": task.id, "index": i % k, "script": script,
            "completion": rows["tokens"][i, P:][rows["input_mask"][i, P:].astype(bool)].tolist(),
            "status": int(out["status"][i]),
            "reward": float(out["reward"][i]) if graded else None,
            "runtime_s": None if np.isnan(out["runtime_s"][i]) else float(out["runtime_s"][i]),
            "error_type": ERROR_TYPES[err] if err >= 0 else None,
        })  # fmt: skip
    statuses = [Status(r["status"]).name for r in records]
    rewards = [r["reward"] for r in records if r["reward"] is not None]
    report = {
        "samples_per_task": k, "tasks": len(tasks), "executions": len(records),
        "new_executions": out["new"],
        "graded": len(rewards),
        "status_counts": {n: statuses.count(n) for n in sorted(set(statuses))},
        "mean_reward": float(np.mean(rewards)) if rewards else None,
        "sample_s": sample_s, "time_s": time.monotonic() - t0, "stream": stream,
    }  # fmt: skip
    if distributed.is_main_process():
        (stage_dir / SAMPLES_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))
    xstages.finish(stage_dir, report, _fingerprint(config, POLICY_SAMPLES))
    return records, report


def wm_pretraining_executions(prepared, samples_report: dict | None) -> dict:
    """Real executions spent before RL on the WM's training data, a cost beside RL's own
    `real_executions` (as embodied reports its WM-pretraining rollouts): the executed corpus
    of the training tasks (the held-out tasks' executions only measure the WM) and the
    policy samples (`samples_report`, None when there are none)."""
    train_ids = {t.id for t in prepared.train_tasks}
    corpus = sum(r["split"] == "train" and r["task_id"] in train_ids for r in prepared.executions)
    samples = samples_report["executions"] if samples_report else 0
    return {"corpus": int(corpus), "policy_samples": int(samples), "total": int(corpus + samples)}


def policy_sample_rows(config, prepared, records: list[dict]) -> dict:
    """WM rows of the graded policy samples (an ungraded execution is no outcome: never a
    target), in the layout RL scores: the task's prompt and the sampled tokens themselves;
    group = their task, `script_index` after the corpus's (`data.scripts_per_task` + the
    sample's index within its task), real targets (reward, status, runtime, error type),
    `time_limit_s` the limit they were executed under."""
    tasks = prepared.train_tasks + prepared.heldout_tasks
    index = {t.id: i for i, t in enumerate(tasks)}
    by_id = {t.id: t for t in tasks}
    recs = [r for r in records if r["status"] != int(Status.UNGRADED)]
    P, N = config.data.max_prompt_len, config.data.max_new_tokens
    prompts = [rldata.task_prompt(config, by_id[r["task_id"]]) for r in recs]
    ids, pmask = rldata.encode_prompts(prepared.tokenizer, prompts, P)
    comp, cmask = np.zeros((len(recs), N), np.int32), np.zeros((len(recs), N), bool)
    for i, r in enumerate(recs):
        comp[i, : len(r["completion"])] = r["completion"]
        cmask[i, : len(r["completion"])] = True
    rows = {
        "tokens": np.concatenate([ids, comp], axis=1).astype(np.int32),
        "input_mask": np.concatenate([pmask, cmask], axis=1),
        "loss_mask": np.concatenate([np.zeros_like(pmask), cmask], axis=1).astype(np.float32),
        "fits": np.ones(len(recs), bool),
        **rldata.reward_targets(recs),
    }
    rows["group"] = np.array([index[r["task_id"]] for r in recs], np.int32)
    start = config.data.scripts_per_task
    rows["script_index"] = np.array([start + r["index"] for r in recs], np.int32)
    cap = config.suite.time_limit_s
    rows["time_limit_s"] = np.array(
        [rldata.time_limit(by_id[r["task_id"]], cap) for r in recs], np.float32
    )
    return rows


def split_policy_samples(config, rows: dict) -> tuple[dict, dict]:
    """`(fit rows, held-out rows)` of the policy samples: every `wm.policy_validation_every`
    = v-th sample of each task (index % v == v - 1; v = 0: none) is held out, so the report
    can say how well the WM ranks *new policy scripts* of seen tasks, the rows it scores in
    RL, whether or not it was fitted on the others (`wmrl.benchmarks.wm_quality`)."""
    every = config.wm.policy_validation_every
    j = rows["script_index"] - config.data.scripts_per_task
    val = (j % every == every - 1) if every > 0 else np.zeros(len(j), bool)
    return {k: v[~val] for k, v in rows.items()}, {k: v[val] for k, v in rows.items()}


def policy_fit_records(config, records: list[dict]) -> list[dict]:
    """The policy samples' records a WM fits on: all but the held-out ones
    (`split_policy_samples`'s rule on the records themselves)."""
    every = config.wm.policy_validation_every
    return [r for r in records if every == 0 or r["index"] % every != every - 1]


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
    report = _done(stage_dir, config)
    if report is not None:
        return load_params(stage_dir, wm.state.params), report
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
