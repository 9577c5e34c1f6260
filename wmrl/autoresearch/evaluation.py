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
from wmrl.autoresearch import execution
from wmrl.autoresearch.env.grader import Status
from wmrl.models.sampler import SamplingConfig, generate


def rl_sampling(config, tok, num_samples: int) -> SamplingConfig:
    """RL's sampling settings (`data.max_new_tokens`, `rl.temperature`) with `num_samples`
    scripts per prompt: the RL step's, the held-out evaluation's and the policy samples'."""
    return SamplingConfig(
        max_new_tokens=config.data.max_new_tokens, eos_id=tok.eos_id, pad_id=tok.pad_id,
        num_samples=num_samples, temperature=config.rl.temperature,
    )  # fmt: skip


def eval_key(rl_seed: int, step: int):
    """The sampling key of the held-out evaluation at `step` of a run with RL seed `rl_seed`
    (a stream apart from the training steps' `key(rl_seed)`): the same scripts are sampled
    again from the step's checkpoint (`wmrl.tools.heldout_scripts`)."""
    return jax.random.fold_in(jax.random.key(rl_seed + 1), step)


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
    pool, journal, step: int, row_tasks: list, scripts: list[str], kind: str
) -> dict:
    """Execute `scripts[i]` on `row_tasks[i]` for real (`wmrl.autoresearch.execution`: this
    process's round-robin share on its own `pool`, execution seed key `{kind}/{step}/{i}`,
    the journal's record of (step, i, script) reused instead of executing again, every new
    outcome journalled), merged so every process returns the same arrays (`status`,
    `reward` exactly the grader's with NaN where ungraded, `runtime_s`, `error_type`,
    `validation`, and an imported competition's verdict as `medal`, `above_median` and
    `position_score`: `execution.merged_outcomes`) and `new` (executions not taken from a
    journal, over all processes)."""
    rows = np.arange(len(scripts))
    out, new = execution.execute(journal, pool, step, rows, row_tasks, scripts, kind)
    return {**out, "new": new}


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


def heldout_change(before: dict, after: dict) -> dict:
    """The held-out reward's change from evaluation `before` (the warm start) to `after`,
    paired by task: `heldout_change` is the mean over the tasks graded at both of the
    per-task difference of mean rewards, `heldout_change_se` its standard error,
    `sd(d_1..d_T, ddof=1) / sqrt(T)` (None with fewer than two tasks), `heldout_change_tasks`
    T. Pairing removes the variance between tasks that both evaluations share, so the change
    is far more precise than the difference of the two rewards' own standard errors says:
    one run can tell learning from noise."""
    a, b = before.get("heldout_per_task") or {}, after.get("heldout_per_task") or {}
    d = np.asarray([b[t] - a[t] for t in a if a[t] is not None and b.get(t) is not None])
    return {
        "heldout_change": float(d.mean()) if len(d) else None,
        "heldout_change_se": float(np.std(d, ddof=1) / np.sqrt(len(d))) if len(d) >= 2 else None,
        "heldout_change_tasks": len(d),
    }


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
