"""Real anchor executions: the journal that outlives preemption, and the queue that runs them.

`AnchorJournal` is the append-only record of every completed real execution, keyed by
(step, row, script hash), read back on resume so that a redone step reuses what it already
paid for. `AnchorQueue` owns the rest of the anchor stream: submitting a step's anchor rows
and collecting every process's outcomes (`wmrl.autoresearch.execution`), the lag
(`rl.anchor_lag = 1`: a step trains on the previous step's anchors while its own execute),
draining before untimed work, and resubmitting the pending rows after a restart. What
survives a restart is the `Pending` record of `RunState` (the queue's checkpoint tree) plus
the journal; the futures in flight do not.
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
from wmrl.autoresearch import execution
from wmrl.autoresearch.state import Pending
from wmrl.jsonl import JsonlWriter, read_jsonl


def script_sha(text: str) -> str:
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
        return rec if rec is not None and rec["sha"] == script_sha(script) else None

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
        rec = {"step": step, "row": row, "sha": script_sha(script), "task_id": task_id,
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


# A step's anchor rows handed to the pool (the one execution record of every real run).
Submission = execution.Execution


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
        """Submit this process's share of the given anchor rows of `step` to its own pool
        (`execution.submit`: round-robin, journal hits reused, seed keys `anchor/{step}/{row}`,
        the same when a resumed run executes them again)."""
        return execution.submit(self.journal, self.pool, step, rows, tasks, scripts, "anchor")

    def collect(self, sub: Submission) -> Outcomes:
        """Wait for this process's executions, then merge every process's outcomes (the
        journal is uploaded at the end of the step, not here)."""
        out, new = execution.collect(self.journal, sub, flush=False)
        r_env = np.where(np.isnan(out["reward"]), 0.0, out["reward"]).astype(np.float32)
        return Outcomes(
            sub.step, sub.rows, r_env, out["status"], new,
            runtime_s=out["runtime_s"].astype(np.float32), error_type=out["error_type"],
            validation=out["validation"].astype(np.float32),
        )  # fmt: skip

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
        inf.resolved_new += execution.resolve(self.journal, inf)
        self.journal.flush()
        return float(distributed.allgather_host(np.float64(time.monotonic() - t0)).max())

    def forget(self) -> None:
        """Drop the executions in flight, as a restart does (they are resubmitted)."""
        self._inflight = None
