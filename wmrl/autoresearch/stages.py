"""Stages before RL: warm start (SFT), the policy samples and world-model pretraining
(`wmrl.autoresearch.wm_pretraining`), each saved once and reused.

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
    whose scorer is fitted when RL starts, nor for `"verdict"`, the policy's own backbone)."""
    skip = () if config.wm.policy_samples_per_task > 0 else (POLICY_SAMPLES,)
    if config.wm.kind in ("features", "verdict"):
        skip = (*skip, "wm_pretrain")
    return tuple(s for s in STAGE_FIELDS if s not in skip)


def stages_done(config, init_dir) -> bool:
    """Whether every stage before RL (the warm start, the policy samples when configured and
    the WM pretraining, written after the data stage) has completed under `init_dir` with
    this config."""
    init_dir = epath.Path(init_dir)
    return all(stage_done(init_dir / s, config) is not None for s in active_stages(config))


def _fingerprint(config, stage: str) -> dict:
    out = xstages.config_fields(config, STAGE_FIELDS[stage])
    if not config.suite.dir:  # built-in tasks: their rows are the builder's version's
        out["suite_version"] = SUITE_VERSION
    if config.env.turns > 1:  # multi-turn stages train on episodes; single-turn ones as before
        out["env"] = config.env.to_dict()
        if stage == "warmstart":  # since 2026-12-08 without the episodes' first turns
            out["sft_episode_turns"] = "later"
    return out


def stage_done(stage_dir: epath.Path, config) -> dict | None:
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


def sft_rows(config, prepared: rldata.Prepared) -> dict:
    """SFT examples (training tasks only) that fit the context; see `data.sft_documents`.
    Multi-turn (env.turns > 1): also the later turns of the executed SFT episodes, prompted
    with their real history (`data.episode_documents`), so the policy learns to read an
    observation and fix or keep its script. The episodes' first turns stay out: their prompt
    is the single-turn card, and they are the author's planned mistakes and weak models (a fix
    episode starts from a mistake), so they would raise the first turn's mistake rate above
    the corpus's `data.mistake_rate` as `env.sft_episodes_per_task` grows."""
    docs = rldata.sft_documents(config, prepared.train_tasks, prepared.episode_tasks)
    if config.env.turns > 1:
        tok, width = prepared.tokenizer, config.data.max_prompt_len
        fits = lambda text: len(tok.encode(pretrained.prompt(config, text), add_bos=True)) <= width
        docs += rldata.episode_documents(
            config, prepared.episodes, prepared.episode_tasks, fits, first_turns=False
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
    report = stage_done(stage_dir, config)
    if report is not None:
        return xstages.load_params(stage_dir, policy.state.params), report
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
    report = stage_done(stage_dir, config)
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
