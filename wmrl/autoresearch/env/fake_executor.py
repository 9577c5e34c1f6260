"""An executor without a sandbox: outcomes scripted by script hash, latency simulated.

`FakeExecutor` implements the executor protocol (`executor.Executor`: `submit`,
`submit_batch`, `as_completed`, `run`, `free_slots`, `close`, the context manager,
`num_workers`, `isolation`) so that the code around executions — the anchor queue's lag,
drain, forget and resubmission, the held-out evaluation's merge, multi-turn rollouts, every
mode of the trainer — can be tested in-process in seconds. It never runs a script: each
outcome is looked up by the script's SHA-256 in `outcomes`, else computed by `default(task,
script)`, else refused (`KeyError`), so a test states exactly what each execution returns.

Its results say `isolation="fake"`, which no real executor reports, so a figure made with it
cannot pass for a measured one. It is a test double: the real pool (`pool.SandboxPool`) and
the Ray executor stay tested for real, with real processes.

    fake = FakeExecutor({sha("print(1)"): Outcome(Status.VALID, 0.75)}, workers=2,
                        latency_s=0.01)
    with fake:
        fut = fake.submit(task, "print(1)", key="anchor/0/3")
        fut.result().reward   # 0.75
    fake.calls                # [Call(task_id, sha, key)] in submission order
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import hashlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

from wmrl.autoresearch.env.grader import Status, reward
from wmrl.autoresearch.env.result import ExecutionResult, InfrastructureError

ISOLATION = "fake"


def sha(script: str | bytes) -> str:
    """The key of a script in `FakeExecutor`'s outcomes: SHA-256 of its UTF-8 bytes."""
    data = script.encode("utf-8") if isinstance(script, str) else script
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one fake execution returns. `reward` defaults to the ladder's reward of `status`
    (a VALID outcome must give its own, in [0.5, 1]); UNGRADED gets NaN, as from a real pool.
    `latency_s` overrides the executor's latency for this script; `error` makes the
    execution raise `InfrastructureError` instead (a broken sandbox, not the script's
    fault)."""

    status: Status
    reward: float | None = None
    runtime_s: float = 0.1
    validation: float | None = None
    error_type: str = "none"
    latency_s: float | None = None
    error: str | None = None

    def __post_init__(self):
        if self.status == Status.VALID and not (
            self.reward is not None and 0.5 <= self.reward <= 1.0
        ):
            raise ValueError(f"a VALID outcome needs its reward in [0.5, 1], got {self.reward}")
        if self.reward is not None and not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.reward}")


@dataclasses.dataclass(frozen=True)
class Call:
    """One submission, in order: which task, which script (its hash), which execution key."""

    task_id: str
    sha: str
    key: str | None
    cut_s: float | None = None  # the cap it was submitted under (None: its full limit)


def hashed_outcome(task, script: str | bytes) -> Outcome:
    """A deterministic outcome for any script, spread over the reward ladder by its hash
    (for runs whose scripts a test cannot list in advance, e.g. sampled by a policy):
    1 in 8 a runtime error, 1 in 8 no submission, the rest VALID with a reward in [0.5, 1]."""
    h = int(sha(script)[:8], 16)
    if h % 8 == 0:
        return Outcome(Status.RUNTIME_ERROR, error_type="ValueError")
    if h % 8 == 1:
        return Outcome(Status.NO_SUBMISSION)
    return Outcome(Status.VALID, 0.5 + 0.5 * ((h >> 3) % 1001) / 1000.0)


class FakeExecutor:
    """The executor protocol over scripted outcomes (module docstring).

    `workers` slots run executions concurrently (threads that only sleep), each taking
    `latency_s` (a number, or a function of the script) unless its `Outcome` says otherwise,
    so futures complete out of submission order exactly as the latencies say. `free_slots()`
    is `workers` minus the executions in flight. `calls` lists every submission.
    """

    def __init__(
        self,
        outcomes: Mapping[str, Outcome] | None = None,
        *,
        default: Callable[[object, str | bytes], Outcome] | None = None,
        workers: int = 2,
        latency_s: float | Callable[[str | bytes], float] = 0.0,
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.outcomes = dict(outcomes or {})
        self.default = default
        self.num_workers = workers
        self.isolation = ISOLATION
        self.latency_s = latency_s
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._inflight = 0
        self._threads = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fake")
        self._closed = False

    # --------------------------------------------------------------- the executor protocol

    def submit(
        self, task, script: str | bytes, key: str | None = None, cut_s: float | None = None
    ) -> cf.Future:
        """As `SandboxPool.submit`: with `cut_s`, an outcome whose `runtime_s` is above the
        cap comes back cut (UNGRADED, NaN reward, `runtime_s = cut_s`, `cut=True`)."""
        if self._closed:
            raise RuntimeError("FakeExecutor is closed")
        outcome = self._outcome(task, script)  # a script nobody scripted fails here, loudly
        with self._lock:
            self.calls.append(Call(task.id, sha(script), key, cut_s))
            self._inflight += 1
        return self._threads.submit(self._execute, task, script, outcome, cut_s)

    def submit_batch(self, items: Iterable[tuple]) -> list[cf.Future]:
        return [self.submit(*item) for item in items]

    def as_completed(self, futures: Iterable[cf.Future]) -> Iterator[cf.Future]:
        return cf.as_completed(list(futures))

    def run(self, task, script: str | bytes, key: str | None = None) -> ExecutionResult:
        return self.submit(task, script, key).result()

    def free_slots(self) -> int:
        with self._lock:
            return max(self.num_workers - self._inflight, 0)

    def close(self) -> None:
        self._closed = True
        self._threads.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --------------------------------------------------------------- internals

    def _outcome(self, task, script) -> Outcome:
        found = self.outcomes.get(sha(script))
        if found is not None:
            return found
        if self.default is not None:
            return self.default(task, script)
        raise KeyError(f"FakeExecutor: no outcome scripted for script {sha(script)[:12]}")

    def _execute(self, task, script, outcome: Outcome, cut_s=None) -> ExecutionResult:
        try:
            latency = outcome.latency_s
            if latency is None:
                latency = self.latency_s(script) if callable(self.latency_s) else self.latency_s
            if latency > 0:
                time.sleep(latency)
            if outcome.error is not None:
                raise InfrastructureError(outcome.error)
            if cut_s is not None and outcome.runtime_s > cut_s:
                return ExecutionResult(
                    task_id=task.id, status=Status.UNGRADED, reward=math.nan, score=None,
                    percentile=None, runtime_s=float(cut_s), stdout_tail="", stderr_tail="",
                    isolation=ISOLATION, detail="scripted: cut", cut=True,
                )  # fmt: skip
            if outcome.status == Status.UNGRADED:
                r = math.nan
            else:
                r = outcome.reward if outcome.reward is not None else reward(outcome.status)
            return ExecutionResult(
                task_id=task.id, status=outcome.status, reward=float(r), score=None,
                percentile=(2 * r - 1) if outcome.status == Status.VALID else None,
                runtime_s=outcome.runtime_s, stdout_tail="", stderr_tail="",
                isolation=ISOLATION, detail="scripted", validation=outcome.validation,
                error_type=outcome.error_type,
            )  # fmt: skip
        finally:
            with self._lock:
                self._inflight -= 1
