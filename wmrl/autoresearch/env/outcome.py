"""How one finished execution is graded: the supervisor's report of a script's run (exit,
signal, CPU time, OOM kill, whether its submission was copied out) and, when the script
ended cleanly, the grade its supervisor gave the submission, into the `ExecutionResult` the
pool returns. Pure functions of the report (no process, no file but the supervisor's
grade.json), apart from the pool that schedules the executions (`pool.SandboxPool`)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from wmrl.autoresearch.env.grader import Grade, Status, no_score_verdict, reward
from wmrl.autoresearch.env.observation import error_type_of
from wmrl.autoresearch.env.result import ExecutionResult, InfrastructureError
from wmrl.autoresearch.env.sandbox import Limits
from wmrl.autoresearch.env.task import Task

TAIL_CHARS = 2000


def submission_grade(limits: Limits, copied: str, workdir: Path, over_budget: bool) -> Grade:
    """The grade of a cleanly finished script's submission (``copied``: what the
    supervisor's copy-out said), as the supervisor graded it (``forkserver._grade``).

    Graded out of the trainer's interpreter, so nothing a submission holds can hold the
    GIL here; within ``limits.grade_cpu_s`` of CPU time, or the submission is INVALID (it
    cannot be graded in bounded time: the submitter's doing, as nothing else runs in that
    process then). A grader that raises is the infrastructure's failure: InfrastructureError,
    retried, then UNGRADED (as is one past its wall-clock deadline: ``supervisor_exit``).
    """
    if copied == "too_large":
        return grade_of(
            Status.INVALID_SUBMISSION, f"submission larger than {limits.submission_mb} MB"
        )
    if copied != "ok":
        return grade_of(Status.NO_SUBMISSION, "no submission")
    if over_budget:
        return grade_of(
            Status.INVALID_SUBMISSION,
            f"the submission could not be graded within {limits.grade_cpu_s:g} s of CPU time",
        )
    answer = json.loads((workdir / "grade.json").read_text())
    if "over_memory" in answer:
        return grade_of(
            Status.INVALID_SUBMISSION,
            f"the submission could not be graded within {answer['over_memory']} MB of memory",
        )
    if "error" in answer:
        raise InfrastructureError("grader failed: " + answer["error"][-1000:])
    return Grade.from_json(answer["grade"])


def supervisor_exit(code: int, grade_wall_s: float) -> str:
    """Why a supervisor that did not finish counts as an infrastructure failure."""
    if code == -signal.SIGALRM:
        return (
            f"supervisor exited with {code}: its grading passed the {grade_wall_s:g} s "
            "wall-clock deadline without using its CPU budget (a stalled host)"
        )
    return f"supervisor exited with {code}"


def grade_of(status: Status, detail: str) -> Grade:
    return Grade(status, None, None, reward(status), detail)


def script_outcome(limits: Limits, raw: dict) -> Grade | None:
    """How the script ended, when that alone decides its grade (memory, time, a crash, a
    non-zero exit); None when it exited cleanly and its submission decides."""
    cpu_limit = int(limits.time_limit_s) + 1
    cpu_hit = raw.get("cpu_s") is not None and raw["cpu_s"] >= cpu_limit - 0.05
    sig = raw.get("signal")
    if raw.get("oom_killed"):
        return grade_of(
            Status.RUNTIME_ERROR, "memory limit (a process was OOM-killed in the job cgroup)"
        )
    if raw["timed_out"] or (sig is not None and cpu_hit) or sig == 24:  # 24 = SIGXCPU
        return grade_of(Status.TIMEOUT, "time limit")
    if sig is not None:
        return grade_of(Status.RUNTIME_ERROR, f"signal {sig}")
    if raw.get("exit_code") not in (0, None):
        return grade_of(Status.RUNTIME_ERROR, f"exit code {raw['exit_code']}")
    return None


def cut_result(task: Task, raw: dict, cut_s: float) -> ExecutionResult:
    """A script its supervisor stopped at the cap ``cut_s`` (below its time limit): what it
    printed and how long it ran, nothing graded. UNGRADED with a NaN reward, so that a
    caller that ignores ``cut`` masks it rather than scoring it; never a TIMEOUT."""
    return ExecutionResult(
        task_id=task.id, status=Status.UNGRADED, reward=reward(Status.UNGRADED), score=None,
        percentile=None, runtime_s=float(raw["runtime_s"]),
        stdout_tail=raw["stdout_tail"][-TAIL_CHARS:], stderr_tail=raw["stderr_tail"][-TAIL_CHARS:],
        isolation=raw["isolation"], detail=f"cut at the {cut_s:g} s cap (not graded)", cut=True,
    )  # fmt: skip


def execution_result(task: Task, raw: dict, grade: Grade) -> ExecutionResult:
    benchmark = grade.benchmark
    if benchmark is None and grade.status in (Status.NO_SUBMISSION, Status.INVALID_SUBMISSION):
        benchmark = no_score_verdict(task)  # one the pool decided (too large, over budget)
    return ExecutionResult(
        task_id=task.id,
        status=grade.status,
        reward=grade.reward,
        score=grade.score,
        percentile=grade.percentile,
        runtime_s=float(raw["runtime_s"]),
        stdout_tail=raw["stdout_tail"][-TAIL_CHARS:],
        stderr_tail=raw["stderr_tail"][-TAIL_CHARS:],
        isolation=raw["isolation"],
        detail=grade.detail,
        validation=grade.validation,
        benchmark=benchmark,
        error_type=error_type_of(
            raw["stderr_tail"], grade.status, oom_killed=bool(raw.get("oom_killed"))
        ),
    )
