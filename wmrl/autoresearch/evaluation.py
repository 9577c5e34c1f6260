"""Sampling scripts from the policy and executing them for real, and the held-out
evaluation's report from their outcomes.

`generate_rows` (the policy's scripts for some tasks, in the shared token layout) and
`execute_scripts` (each script run in the sandbox pool, dealt round-robin over the JAX
processes, journal hits reused) are the one sampler and executor of the held-out evaluation
(`Trainer.evaluate`) and of the policy-sample stage (`wmrl.autoresearch.stages.policy_samples`).
"""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np

from wmrl import distributed
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch.env.grader import Status
from wmrl.models.sampler import SamplingConfig, generate


def rl_sampling(config, tok, num_samples: int) -> SamplingConfig:
    """RL's sampling settings (`data.max_new_tokens`, `rl.temperature`) with `num_samples`
    scripts per prompt: the RL step's, the held-out evaluation's and the policy samples'."""
    return SamplingConfig(
        max_new_tokens=config.data.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
        num_samples=num_samples, temperature=config.rl.temperature,
    )  # fmt: skip


def generate_rows(graphdef, params, tok, prompts: list[str], prompt_len: int, sc, key, max_len):
    """`sc.num_samples` scripts per prompt from the policy (`graphdef`, `params`): rows in the
    shared layout (`tokens`, `input_mask`, `loss_mask`, `old_logp`, each `[n*G, P+N]`,
    prompt-major) and the decoded scripts. Identical on every process."""
    ids, mask = rldata.encode_prompts(tok, prompts, prompt_len)
    out = generate(graphdef, params, jnp.asarray(ids), jnp.asarray(mask), key, sc, max_len)
    comp, cmask, logp = distributed.process_allgather_to_numpy((out.tokens, out.mask, out.logprobs))
    G = sc.num_samples
    rows = {
        "tokens": np.concatenate([np.repeat(ids, G, axis=0), comp], axis=1),
        "input_mask": np.concatenate([np.repeat(mask, G, axis=0), cmask], axis=1),
        "loss_mask": np.concatenate(
            [np.zeros((len(comp), prompt_len), np.float32), cmask.astype(np.float32)], axis=1
        ),
        "old_logp": np.concatenate(
            [np.zeros((len(comp), prompt_len), np.float32), logp * cmask], axis=1
        ),
    }
    return rows, decode_scripts(tok, comp, cmask)


def decode_scripts(tok, comp: np.ndarray, cmask: np.ndarray) -> list[str]:
    """The scripts of completions `[n, N]` (tokens where `cmask`)."""
    return [tok.decode(row[m.astype(bool)]) for row, m in zip(comp, cmask, strict=True)]


def execute_scripts(
    pool, journal, step: int, row_tasks: list, scripts: list[str], kind: str,
    observations: bool = False,
) -> dict:  # fmt: skip
    """Execute `scripts[i]` on `row_tasks[i]` for real: this process's round-robin share on
    its own `pool` (execution seed key `{kind}/{step}/{i}`), the journal's record of
    (step, i, script) reused instead of executing again, every new outcome journalled; then
    the shares merged so every process returns the same arrays: `status` [n] int32, `reward`
    [n] float64 (exactly the grader's; NaN where ungraded), `new` (executions not taken from
    a journal, over all processes), an imported competition's verdict (also journalled) as
    `medal`, `above_median` and `position_score` [n] float64 (`competitions.report.
    verdict_row`: NaN where it does not apply) and, with `observations` (also journalled),
    `runtime_s` [n] float64 (NaN where unknown) and `error_type` [n] int32 (index into
    `observation.ERROR_TYPES`, -1 where unknown)."""
    from wmrl.autoresearch.env.competitions.report import VERDICT_FIELDS, verdict_row
    from wmrl.autoresearch.env.observation import ERROR_TYPES

    err_index = lambda name: ERROR_TYPES.index(name) if name in ERROR_TYPES else -1
    n = len(scripts)
    owner = distributed.round_robin_owners(n)
    mine = np.nonzero(owner == jax.process_index())[0]
    out = {
        "status": np.full(n, int(Status.UNGRADED), np.int32),
        "reward": np.full(n, np.nan),  # float64: exactly the grader's rewards
        **{name: np.full(n, np.nan) for name in VERDICT_FIELDS},
    }

    def verdict(i, status, benchmark) -> None:
        for name, value in zip(VERDICT_FIELDS, verdict_row(row_tasks[i], status, benchmark),
                               strict=True):  # fmt: skip
            out[name][i] = value

    if observations:
        out["runtime_s"], out["error_type"] = np.full(n, np.nan), np.full(n, -1, np.int32)
    futs = {}
    for i in mine:
        hit = journal.lookup(step, int(i), scripts[i])
        if hit is None:
            futs[i] = pool.submit(row_tasks[i], scripts[i], key=f"{kind}/{step}/{i}")
            continue
        out["status"][i] = hit["status"]
        out["reward"][i] = np.nan if hit["reward"] is None else hit["reward"]
        verdict(i, hit["status"], hit.get("benchmark"))
        if observations:
            out["runtime_s"][i] = hit.get("runtime_s", np.nan)
            out["error_type"][i] = err_index(hit.get("error_type"))
    for i, fut in futs.items():
        res = fut.result()
        out["status"][i], out["reward"][i] = int(res.status), res.reward
        verdict(i, res.status, res.benchmark)
        extra = {"benchmark": res.benchmark}
        if observations:
            extra |= {"runtime_s": res.runtime_s, "error_type": res.error_type}
            out["runtime_s"][i], out["error_type"][i] = res.runtime_s, err_index(res.error_type)
        journal.record(step, int(i), scripts[i], row_tasks[i].id, res.status, res.reward, **extra)
    journal.flush()
    merged = distributed.merge_from_owners(out, owner)
    return {**merged, "new": int(distributed.allgather_host(np.int64(len(futs))).sum())}


def heldout_se(per_task: list[float]) -> float | None:
    """Standard error of the held-out reward that counts the variance between held-out tasks:
    the standard error of the mean over tasks of the per-task mean rewards,
    `sd(m_1..m_T, ddof=1) / sqrt(T)`.

    The held-out tasks are a sample of a family of tasks, and each task's mean `m_t` is itself
    the mean of k sampled scripts, so `Var(m_t) = s2_between + s2_within / k`: the spread of
    the per-task means estimates both parts at once (a two-stage / cluster sample's standard
    error), where the standard error over the T*k scripts pooled counts only the scripts'
    spread as if they were independent draws from one task. It says how far another draw of
    tasks from the family and of scripts from the policy would move the evaluation. None with
    fewer than two tasks."""
    m = np.asarray(per_task, float)
    return float(np.std(m, ddof=1) / np.sqrt(len(m))) if len(m) >= 2 else None


def heldout_summary(
    tasks: list, k: int, status: np.ndarray, reward: np.ndarray, verdicts: dict | None = None
) -> dict:
    """Mean reward (with its standard errors), status rates and per-task means of k scripts
    per held-out task; status [T*k] int, reward [T*k] float64 (NaN where ungraded), task t's
    scripts at [t*k, (t+1)*k). With `verdicts` (`execute_scripts`'s `medal`, `above_median`
    and `position_score`) and imported competitions among the tasks, `heldout_benchmark` is
    the evaluation in the benchmarks' own terms (`competitions.report.heldout_benchmark`).

    `heldout_reward_se` is `heldout_se` over the tasks with a graded script (between-task
    variance counted; with a single task, the standard error over its scripts);
    `heldout_reward_se_scripts` is the standard error over the graded scripts pooled (the
    evaluation's sampling noise alone, the older figure)."""
    graded = status != int(Status.UNGRADED)
    counts = Counter(Status(int(s)).name for s in status[graded])
    per_task = {}
    for i, t in enumerate(tasks):
        rs = reward[i * k : (i + 1) * k][graded[i * k : (i + 1) * k]]
        per_task[t.id] = float(np.mean(rs)) if len(rs) else None
    scripts_se = (
        float(np.std(reward[graded], ddof=1) / np.sqrt(graded.sum())) if graded.sum() > 1 else None
    )
    task_se = heldout_se([m for m in per_task.values() if m is not None])
    bench = {}
    if verdicts is not None:
        from wmrl.autoresearch.env.competitions.report import heldout_benchmark

        figures = heldout_benchmark(tasks, k, verdicts)
        bench = {} if figures is None else {"heldout_benchmark": figures}
    return {
        "heldout_reward": float(np.mean(reward[graded])) if graded.any() else None,
        "heldout_reward_se": scripts_se if task_se is None else task_se,
        "heldout_reward_se_scripts": scripts_se,
        "heldout_tasks": sum(m is not None for m in per_task.values()),
        "heldout_status_rates": {
            s.name: counts.get(s.name, 0) / max(int(graded.sum()), 1)
            for s in Status
            if s != Status.UNGRADED
        },
        "heldout_per_task": per_task,
        "heldout_ungraded": int((~graded).sum()),
        **bench,
    }
