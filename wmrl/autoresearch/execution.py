"""Real executions of one step's scripts, journalled and shared out over the JAX processes.

The one "execute round-robin with journal reuse, then merge" of the AutoResearch trainers:
the anchors (`wmrl.autoresearch.anchors.AnchorQueue`), the held-out evaluation and the
policy-sample stage (`wmrl.autoresearch.evaluation.execute_scripts`) and multi-turn's real
turns (`wmrl.autoresearch.multiturn`) all run through it.

* `submit`: this process's round-robin share of the rows (row position k goes to process
  `k % process_count`) to its own sandbox pool; a row whose (step, row, script) the journal
  already holds is not executed again (a step redone after preemption pays nothing twice).
  The execution's seed key `{kind}/{step}/{row}` is a function of the row alone, so a
  resumed run's sandbox draws the same seeds.
* `collect`: waits for this process's executions, journalling each outcome as it completes,
  then merges every process's records into arrays identical on every process.

Submission and collection are separate so that work can run while the sandbox executes
(the WM scores the batch in the meantime; with `rl.anchor_lag = 1` a whole step does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import numpy as np

from wmrl import distributed
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import ERROR_TYPES


def result_fields(res) -> dict:
    """What a journal record keeps of an execution beyond its status and reward: the runtime,
    the error type and the validation metric as the sandbox reported them (the WM's
    observation targets), and an imported competition's verdict (`benchmark`). A result
    without one of them (a stand-in pool's) records None."""
    return {
        "runtime_s": getattr(res, "runtime_s", None),
        "error_type": getattr(res, "error_type", None),
        "validation": getattr(res, "validation", None),
        "benchmark": getattr(res, "benchmark", None),
        "cut": bool(getattr(res, "cut", False)),  # stopped at a cap: never a reward
    }


@dataclasses.dataclass
class Execution:
    """Rows of one step handed to the pool: `items` maps this process's positions k (journal
    row `rows[k]`, task `tasks[k]`, script `scripts[k]`) to a future or, once completed or
    found in the journal, its journal record. `resolved_new` counts executions an earlier
    wait (`resolve` outside `collect`) already journalled."""

    step: int
    rows: np.ndarray  # [n] int: the journal's row keys
    tasks: list
    scripts: list[str]
    items: dict
    resolved_new: int = 0


def submit(
    journal, pool, step: int, rows, tasks: list, scripts: list[str], kind: str,
    sandbox_task: Callable | None = None, cut_s=None,
) -> Execution:  # fmt: skip
    """Hand this process's share of `rows` (journal keys; task `tasks[k]`, script
    `scripts[k]`) to `pool`, journal hits reused. `kind` names the execution seeds (anchor,
    eval, ...); `sandbox_task(task)` is the task the sandbox runs (default: `task` itself;
    multi-turn runs a suite task's episode task), the journal keeps `task.id`. `cut_s[k]`:
    the cap row k runs under (cost-aware routing; None = its full limit); a row it cuts is
    journalled as cut, and a journal hit of one is reused as cut."""
    owner = distributed.round_robin_owners(len(rows))
    me, items = jax.process_index(), {}
    for k, row in enumerate(rows):
        if owner[k] != me:
            continue
        hit = journal.lookup(step, int(row), scripts[k])
        if hit is not None:
            items[k] = hit
            continue
        task = tasks[k] if sandbox_task is None else sandbox_task(tasks[k])
        key = f"{kind}/{step}/{int(row)}"
        if cut_s is None:
            items[k] = pool.submit(task, scripts[k], key=key)
        else:
            items[k] = pool.submit(task, scripts[k], key=key, cut_s=float(cut_s[k]))
    return Execution(step, np.asarray(rows), list(tasks), list(scripts), items)


def resolve(journal, ex: Execution, fields: Callable = result_fields) -> int:
    """Wait for this process's executions in `ex`, journalling each as it completes (its
    status, reward and `fields(result)`) and replacing its future by the record, in place;
    returns how many were new."""
    new = 0
    for k, item in ex.items.items():
        if isinstance(item, dict):
            continue
        res = item.result()
        reward = None if math.isnan(res.reward) else res.reward
        ex.items[k] = journal.record(
            ex.step, int(ex.rows[k]), ex.scripts[k], ex.tasks[k].id, res.status, reward,
            **fields(res),
        )  # fmt: skip
        new += 1
    return new


def merged_outcomes(ex: Execution) -> dict[str, np.ndarray]:
    """Every row's outcome from the journal records of every process (a collective): `status`
    [n] int32 (UNGRADED where none), `reward` [n] float64 (exactly the grader's; NaN where
    ungraded), `runtime_s` [n] float64 (NaN unknown), `error_type` [n] int32 (index into
    `observation.ERROR_TYPES`, -1 unknown), `validation` [n] float64 (NaN none), `cut` [n]
    int32 (1: stopped at a cap, UNGRADED and no reward; cost-aware routing), and an
    imported competition's verdict `medal`, `above_median`, `position_score` [n] float64
    (`competitions.report.verdict_row`: NaN where it does not apply)."""
    from wmrl.autoresearch.env.competitions.report import VERDICT_FIELDS, verdict_row

    n = len(ex.rows)
    out = {
        "status": np.full(n, int(Status.UNGRADED), np.int32),
        "reward": np.full(n, np.nan),
        "runtime_s": np.full(n, np.nan),
        "error_type": np.full(n, -1, np.int32),
        "validation": np.full(n, np.nan),
        "cut": np.zeros(n, np.int32),
        **{name: np.full(n, np.nan) for name in VERDICT_FIELDS},
    }
    for k, rec in ex.items.items():
        out["status"][k] = rec["status"]
        out["reward"][k] = np.nan if rec["reward"] is None else rec["reward"]
        out["runtime_s"][k] = rec.get("runtime_s", np.nan)
        if rec.get("error_type") in ERROR_TYPES:
            out["error_type"][k] = ERROR_TYPES.index(rec["error_type"])
        out["validation"][k] = rec.get("validation", np.nan)
        out["cut"][k] = int(bool(rec.get("cut")))
        verdict = verdict_row(ex.tasks[k], rec["status"], rec.get("benchmark"))
        for name, value in zip(VERDICT_FIELDS, verdict, strict=True):
            out[name][k] = value
    return distributed.merge_from_owners(out, distributed.round_robin_owners(n))


def collect(
    journal, ex: Execution, fields: Callable = result_fields, flush: bool = True
) -> tuple[dict[str, np.ndarray], int]:
    """Wait for this process's executions in `ex` (`resolve`), upload the journal (`flush`;
    the anchors leave it to the end of the step), then merge every process's outcomes
    (`merged_outcomes`). Returns (the arrays, executions not taken from a journal, over all
    processes)."""
    new = resolve(journal, ex, fields) + ex.resolved_new
    if flush:
        journal.flush()
    out = merged_outcomes(ex)
    return out, int(distributed.allgather_host(np.int64(new)).sum())


def execute(
    journal, pool, step: int, rows, tasks: list, scripts: list[str], kind: str,
    sandbox_task: Callable | None = None, fields: Callable = result_fields,
) -> tuple[dict[str, np.ndarray], int]:  # fmt: skip
    """`submit` then `collect` at once, for callers with nothing to do while the scripts run."""
    ex = submit(journal, pool, step, rows, tasks, scripts, kind, sandbox_task)
    return collect(journal, ex, fields)
