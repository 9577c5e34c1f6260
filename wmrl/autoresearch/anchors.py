"""Real anchor executions: the journal that outlives preemption, and the queue that runs them.

`AnchorJournal` is the append-only record of every completed real execution, keyed by
(step, row, script hash), read back on resume so that a redone step reuses what it already
paid for. `AnchorQueue` owns the rest of the anchor stream: submitting a step's anchor rows
and collecting every process's outcomes (`wmrl.autoresearch.execution`), the lag
(`rl.anchor_lag = 1`: a step trains on the previous step's anchors while its own execute),
draining before untimed work, and resubmitting the pending rows after a restart. What
survives a restart is the `Pending` record of `RunState` (the queue's checkpoint tree) plus
the journal; the futures in flight do not.

A journal is trusted only as far as an execution could have written it: every record read
back is checked (`record_problem`: its keys, a status the grader gives, the reward the
ladder gives that status, finite observation fields), and one that fails is refused with
`JournalError`, naming the file and the line, before anything is reused. The record is not
dropped and executed again: a record no execution could write means the file was edited or
corrupted, and a silent re-execution would hide it (deleting the line named executes that
row again on the next resume). A torn last line (a kill mid-write) is the one line skipped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import numpy as np
from etils import epath

from wmrl import distributed
from wmrl.autoresearch import execution
from wmrl.autoresearch.env.grader import Status, reward
from wmrl.autoresearch.state import Pending
from wmrl.jsonl import JsonlWriter


class JournalError(ValueError):
    """A journal line that no execution could have written (the file and line named)."""


_STATUSES = {int(s): s.name for s in Status}


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def record_problem(rec) -> str | None:
    """What makes `rec` a record no execution wrote (None if it could be one): `step`, `row`
    integers >= 0; `sha` 16 hex digits; `task_id` text; `status` a grader status; `reward`
    the ladder's for it (`grader.reward`: 0, 0.1 or 0.2 exactly, VALID's in [0.5, 1],
    UNGRADED's null); where present, `runtime_s` a finite number >= 0, `validation` a finite
    number, `error_type` text, `benchmark` an object or null, `cut` true only UNGRADED."""
    if not isinstance(rec, dict):
        return f"not a JSON object (got {type(rec).__name__})"
    for key in ("step", "row"):
        v = rec.get(key)
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 0):
            return f"{key} {v!r} is not an integer >= 0"
    sha = rec.get("sha")
    if not (isinstance(sha, str) and len(sha) == 16 and all(c in "0123456789abcdef" for c in sha)):
        return f"sha {_short(sha)} is not a script hash (16 hex digits)"
    if not isinstance(rec.get("task_id"), str):
        return f"task_id {_short(rec.get('task_id'))} is not a task id"
    status, r = rec.get("status"), rec.get("reward")
    if not (isinstance(status, int) and not isinstance(status, bool) and status in _STATUSES):
        return f"status {_short(status)} is not a grader status ({sorted(_STATUSES)})"
    name = _STATUSES[status]
    if status == Status.UNGRADED:
        if r is not None:
            return f"reward {_short(r)} with status UNGRADED (UNGRADED's reward is null)"
    elif not (_is_number(r) and math.isfinite(r)):
        return f"reward {_short(r)} with status {name} is not a finite number"
    elif status == Status.VALID:
        if not 0.5 <= r <= 1.0:
            return f"reward {r!r} with status VALID is not between 0.5 and 1"
    elif r != reward(Status(status)):
        return f"reward {r!r} with status {name} is off the ladder ({name}'s reward is " \
            f"{reward(Status(status))})"  # fmt: skip
    runtime = rec.get("runtime_s", 0.0)
    if not (_is_number(runtime) and math.isfinite(runtime) and runtime >= 0):
        return f"runtime_s {_short(runtime)} is not a finite number of seconds >= 0"
    validation = rec.get("validation", 0.0)
    if not (_is_number(validation) and math.isfinite(validation)):
        return f"validation {_short(validation)} is not a finite number"
    if not isinstance(rec.get("error_type", ""), str):
        return f"error_type {_short(rec.get('error_type'))} is not an exception name"
    if not isinstance(rec.get("benchmark"), dict | None):
        return f"benchmark {_short(rec.get('benchmark'))} is not an object"
    cut = rec.get("cut", False)
    if not isinstance(cut, bool) or (cut and status != Status.UNGRADED):
        return f"cut {_short(cut)} with status {name} (a cut execution is UNGRADED)"
    return None


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:60]}... ({len(text)} characters)"


def read_journal(path) -> list[dict]:
    """Every record of the journal at `path` ([] if it does not exist), each checked
    (`record_problem`); the first line that is not a record any execution could write is a
    `JournalError` naming the file and the line. A last line with no newline that does not
    parse is a write a kill cut short and is skipped (`JsonlWriter` cuts it off before it
    appends); blank lines are skipped."""
    path = epath.Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JournalError(f"{path}: not UTF-8 text ({e}); {_EDITED}") from None
    lines = text.split("\n")
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError) as e:
            if n == len(lines):  # no newline after it: torn by a kill
                continue
            raise JournalError(f"{path} line {n}: not JSON ({e}); {_EDITED}") from None
        problem = record_problem(rec)
        if problem is not None:
            raise JournalError(f"{path} line {n}: {problem}; {_EDITED}")
        out.append(rec)
    return out


_EDITED = (
    "no execution writes that, so the journal was edited or corrupted: delete that line to "
    "execute the row again, or choose a new --workdir"
)


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
            self.done.update({(rec["step"], rec["row"]): rec for rec in read_journal(p)})
        self._w = JsonlWriter(path, fsync=True, flush_every_s=self.FLUSH_EVERY_S, create=True)

    def lookup(self, step: int, row: int, script: str) -> dict | None:
        rec = self.done.get((step, row))
        return rec if rec is not None and rec["sha"] == script_sha(script) else None

    def record(
        self, step: int, row: int, script: str, task_id: str, status: int, reward,
        runtime_s: float | None = None, error_type: str | None = None, validation=None,
        benchmark: dict | None = None, cut: bool = False,
    ) -> dict:  # fmt: skip
        """Journal one outcome; `runtime_s`, `error_type` and `validation` (the WM's
        observation targets) and `benchmark` (an imported competition's verdict,
        `ExecutionResult.benchmark`) are optional, and records of older journals lack them.
        `cut`: the execution was stopped at a cap (cost-aware routing), recorded as
        `"cut": true` with no reward; a resumed run reuses it as cut."""
        if reward is not None and math.isnan(reward):
            reward = None
        rec = {"step": step, "row": row, "sha": script_sha(script), "task_id": task_id,
               "status": int(status), "reward": reward}  # fmt: skip
        problem = record_problem(rec)
        if problem is not None:  # never write what a resume would refuse
            raise ValueError(f"{self.path}: refusing to journal step {step} row {row}: {problem}")
        if runtime_s is not None and math.isfinite(runtime_s):
            rec["runtime_s"] = float(runtime_s)
        if error_type is not None:
            rec["error_type"] = str(error_type)
        if validation is not None and math.isfinite(validation):
            rec["validation"] = float(validation)
        if benchmark is not None:
            rec["benchmark"] = benchmark
        if cut:
            rec["cut"] = True
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
    cut: np.ndarray | None = None  # [n] bool: stopped at a cap (`real` under cost routing)


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

    def submit(self, step: int, rows, tasks, scripts, cut_s=None) -> Submission:
        """Submit this process's share of the given anchor rows of `step` to its own pool
        (`execution.submit`: round-robin, journal hits reused, seed keys `anchor/{step}/{row}`,
        the same when a resumed run executes them again); `cut_s`: per row, the cap of
        `real` under cost-aware routing (None: the full limit)."""
        return execution.submit(
            self.journal, self.pool, step, rows, tasks, scripts, "anchor", cut_s=cut_s
        )

    def collect(self, sub: Submission) -> Outcomes:
        """Wait for this process's executions, then merge every process's outcomes (the
        journal is uploaded at the end of the step, not here)."""
        out, new = execution.collect(self.journal, sub, flush=False)
        r_env = np.where(np.isnan(out["reward"]), 0.0, out["reward"]).astype(np.float32)
        return Outcomes(
            sub.step, sub.rows, r_env, out["status"], new,
            runtime_s=out["runtime_s"].astype(np.float32), error_type=out["error_type"],
            validation=out["validation"].astype(np.float32), cut=out["cut"].astype(bool),
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
