"""What one execution returns (`ExecutionResult`), and the error the sandbox machinery raises
when it fails (`InfrastructureError`). Their own module, so that the executors and the
observation the agent reads can name them without importing the pool."""

from __future__ import annotations

import dataclasses

from wmrl.autoresearch.env.grader import Status


@dataclasses.dataclass(frozen=True)
class ExecutionResult:
    """The outcome of one script on one task (what ``run`` prints as JSON)."""

    task_id: str
    status: Status
    reward: float
    score: float | None
    percentile: float | None
    runtime_s: float
    stdout_tail: str
    stderr_tail: str
    isolation: str
    detail: str = ""
    attempts: int = 1
    validation: float | None = None  # the raw metric on an episode task's validation rows
    error_type: str = "none"  # a RUNTIME_ERROR's exception class (observation.ERROR_TYPES)
    # An imported competition's verdict in its benchmark's terms (``grader.Grade.benchmark``:
    # MLE-bench's medal, MLE-Dojo's position score); None for other tasks.
    benchmark: dict | None = None
    # Stopped at a cap below its time limit (``SandboxPool.submit(..., cut_s=)``): nothing
    # was graded (status UNGRADED, reward NaN), and it is not a TIMEOUT: it might have
    # finished within its limit. ``runtime_s`` is the seconds it ran.
    cut: bool = False

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["status"] = self.status.name
        d["status_id"] = int(self.status)
        return d


class InfrastructureError(RuntimeError):
    """The sandbox machinery failed; not the script's fault."""
