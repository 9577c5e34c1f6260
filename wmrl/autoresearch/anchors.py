"""Real anchor executions: the journal that outlives preemption, and the queue that runs them.

`AnchorJournal` is the append-only record of every completed real execution, keyed by
(step, row, script hash), read back on resume so that a redone step reuses what it already
paid for. `AnchorQueue` owns the rest of the anchor stream: submitting a step's anchor rows
(this process's round-robin share, journal hits reused), collecting and merging every
process's outcomes, the lag (`rl.anchor_lag = 1`: a step trains on the previous step's
anchors while its own execute), draining before untimed work, and resubmitting the pending
rows after a restart. What survives a restart is the `Pending` record of `RunState` (the
queue's checkpoint tree) plus the journal; the futures in flight do not.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import numpy as np

from wmrl import distributed
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import ERROR_TYPES
from wmrl.autoresearch.state import Pending
from wmrl.jsonl import JsonlWriter, read_jsonl


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


class AnchorJournal:
    """Append-only record of completed real executions, keyed by (step, row, script hash).

    Read back on resume so a step that is redone after preemption reuses what it already
    executed. In a local workdir each record is written, flushed and fsynced as its execution
    completes. On an object store (gs://...: no append, no fsync) the records are uploaded
    (the whole file, `wmrl.jsonl.JsonlWriter`) by `flush`, which the RL loop calls at the end
    of every step, and by `record` once FLUSH_EVERY_S have passed since the last upload: a
    preemption loses only records of the step in progress written since the last upload,
    and the redone step executes those scripts again.
    """

    FLUSH_EVERY_S = 30.0

    def __init__(self, path: Path, read_also: Iterable[Path] = ()):
        """Appends to `path`; lookups also see the records of `read_also` (the journals of
        other processes, or of a run resumed with another process count)."""
        self.path = path
        self.done = {}
        for p in [*read_also, path]:  # this journal last: its records win
            self.done.update({(rec["step"], rec["row"]): rec for rec in read_jsonl(p)})
        self._w = JsonlWriter(path, fsync=True, flush_every_s=self.FLUSH_EVERY_S, create=True)

    def lookup(self, step: int, row: int, script: str) -> dict | None:
        rec = self.done.get((step, row))
        return rec if rec is not None and rec["sha"] == _sha(script) else None

    def record(
        self, step: int, row: int, script: str, task_id: str, status: int, reward,
        runtime_s: float | None = None, error_type: str | None = None, validation=None,
        benchmark: dict | None = None,
    ) -> dict:  # fmt: skip
        """Journal one outcome; `runtime_s`, `error_type` and `validation` (the WM's
        observation targets) and `benchmark` (an imported competition's verdict,
        `ExecutionResult.benchmark`) are optional, and records of older journals lack them."""
        if reward is not None and math.isnan(reward):
            reward = None
        rec = {"step": step, "row": row, "sha": _sha(script), "task_id": task_id,
               "status": int(status), "reward": reward}  # fmt: skip
        if runtime_s is not None and math.isfinite(runtime_s):
            rec["runtime_s"] = float(runtime_s)
        if error_type is not None:
            rec["error_type"] = str(error_type)
        if validation is not None and math.isfinite(validation):
            rec["validation"] = float(validation)
        if benchmark is not None:
            rec["benchmark"] = benchmark
        self._w.write([rec])
        self.done[(step, row)] = rec
        return rec

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


def journal_path(
    workdir: Path, process_index: int, process_count: int, kind: str = "anchors"
) -> Path:
    """The journal a process appends to: `anchors.jsonl`, or with several processes
    `anchors.p{index}.jsonl` (each host journals the executions it ran, so no two processes
    ever append to one file); `kind="heldout"`: the held-out evaluations' (`heldout.jsonl`)."""
    name = f"{kind}.jsonl" if process_count == 1 else f"{kind}.p{process_index}.jsonl"
    return workdir / name


def open_journal(workdir: Path, kind: str = "anchors") -> AnchorJournal:
    """This process's journal of `kind`, reading every journal of that kind in the workdir
    for reuse."""
    path = journal_path(workdir, jax.process_index(), jax.process_count(), kind)
    others = sorted(p for p in workdir.glob(f"{kind}*.jsonl") if p.name != path.name)
    return AnchorJournal(path, read_also=others)


@dataclasses.dataclass
class Submission:
    """Anchor rows of one step handed to the pool: `items` maps this process's positions k
    (row `rows[k]`, task `tasks[k]`, script `scripts[k]`) to a future or, once completed or
    found in the journal, its journal record. `resolved_new` counts executions an earlier
    wait (`AnchorQueue.drain`) already journalled."""

    step: int
    rows: np.ndarray  # [n] int: indices in the step's batch (the journal's keys)
    tasks: list
    scripts: list[str]
    items: dict
    resolved_new: int = 0


@dataclasses.dataclass(frozen=True)
class Outcomes:
    """The real outcomes of one step's anchor rows, identical on every process."""

    step: int  # the step that sampled them (0-based)
    rows: np.ndarray  # [n] their indices in that step's batch
    r_env: np.ndarray  # [n] float32 real rewards (0 where ungraded)
    status: np.ndarray  # [n] int32 grader status
    new: int  # executions not taken from a journal, over all processes
    runtime_s: np.ndarray | None = None  # [n] float32 seconds, NaN where not journalled
    error_type: np.ndarray | None = None  # [n] int32 index into ERROR_TYPES, -1 = unknown
    validation: np.ndarray | None = None  # [n] float32 raw validation metric, NaN = none


class AnchorQueue:
    """Submission, collection, the one-step lag and draining of the anchor executions.

    lag 0: a step collects its own anchors (`exchange` waits for them). lag 1: a step's
    anchors stay in flight while the next step computes; that step's `exchange` collects them
    (or, after a restart lost the futures, resubmits the pending rows; journal hits are
    reused) and puts its own in flight.
    """

    def __init__(self, journal: AnchorJournal, pool, lag: int):
        self.journal, self.pool, self.lag = journal, pool, lag
        self._inflight: Submission | None = None

    def submit(self, step: int, rows, tasks, scripts) -> Submission:
        """Submit this process's share of the given anchor rows of `step` (row k goes to the
        process `round_robin_owners(n)[k]`) to its own pool; journal hits are reused."""
        owner = distributed.round_robin_owners(len(rows))
        me = jax.process_index()
        items = {}
        for k, row in enumerate(rows):
            if owner[k] != me:
                continue
            hit = self.journal.lookup(step, int(row), scripts[k])
            # The execution's seed key: the same when a resumed run executes it again.
            key = f"anchor/{step}/{int(row)}"
            items[k] = hit if hit is not None else self.pool.submit(tasks[k], scripts[k], key=key)
        return Submission(step, np.asarray(rows), list(tasks), list(scripts), items)

    def _resolve(self, sub: Submission) -> int:
        """Wait for this process's executions in `sub`, journalling each as it completes and
        replacing its future by the record (in place); returns how many were new."""
        new = 0
        for k, item in sub.items.items():
            if isinstance(item, dict):
                continue
            res = item.result()
            reward = None if math.isnan(res.reward) else res.reward
            sub.items[k] = self.journal.record(
                sub.step, int(sub.rows[k]), sub.scripts[k], sub.tasks[k].id, res.status, reward,
                runtime_s=getattr(res, "runtime_s", None),
                error_type=getattr(res, "error_type", None),
                validation=getattr(res, "validation", None),
            )  # fmt: skip
            new += 1
        return new

    def collect(self, sub: Submission) -> Outcomes:
        """Wait for this process's executions, then merge every process's outcomes."""
        n = len(sub.rows)
        new = self._resolve(sub) + sub.resolved_new
        r_env = np.zeros(n, np.float32)
        status = np.full(n, int(Status.UNGRADED), np.int32)
        obs = {"runtime_s": np.full(n, np.nan, np.float32),
               "error_type": np.full(n, -1, np.int32),
               "validation": np.full(n, np.nan, np.float32)}  # fmt: skip
        for k, rec in sub.items.items():
            status[k] = rec["status"]
            r_env[k] = 0.0 if rec["reward"] is None else rec["reward"]
            obs["runtime_s"][k] = rec.get("runtime_s", np.nan)
            if rec.get("error_type") in ERROR_TYPES:
                obs["error_type"][k] = ERROR_TYPES.index(rec["error_type"])
            obs["validation"][k] = rec.get("validation", np.nan)
        owner = distributed.round_robin_owners(n)
        out = distributed.merge_from_owners({"r_env": r_env, "status": status, **obs}, owner)
        new = int(distributed.allgather_host(np.int64(new)).sum())
        return Outcomes(sub.step, sub.rows, out["r_env"], out["status"], new,
                        **{k: out[k] for k in obs})  # fmt: skip

    def exchange(
        self, sub: Submission, pending: Pending, describe: Callable[[Pending], tuple]
    ) -> Outcomes | None:
        """The anchor outcomes this step trains on: with no lag (or no anchors) `sub`'s own;
        with the lag the pending rows' (None when nothing is pending), and `sub` goes in
        flight. `describe(pending)` gives (tasks, scripts) of pending rows to resubmit."""
        if not self.lag or not len(sub.rows):
            return self.collect(sub)
        out = None
        if pending.valid:
            prev = self._inflight
            if prev is None or prev.step != int(pending.step):  # lost in a restart
                prev = self.submit(int(pending.step), pending.rows, *describe(pending))
            out = self.collect(prev)
        self._inflight = sub
        return out

    def drain(self, pending: Pending) -> float:
        """Wait for the executions still in flight (those of `pending`) and journal them;
        returns the seconds waited (the slowest process's). Called before untimed work
        (evaluation, a checkpoint write), so background executions never get time the
        training clock does not see."""
        inf = self._inflight
        if inf is None or not pending.valid or inf.step != int(pending.step):
            return 0.0
        t0 = time.monotonic()
        inf.resolved_new += self._resolve(inf)
        self.journal.flush()
        return float(distributed.allgather_host(np.float64(time.monotonic() - t0)).max())

    def forget(self) -> None:
        """Drop the executions in flight, as a restart does (they are resubmitted)."""
        self._inflight = None
