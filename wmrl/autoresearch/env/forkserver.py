"""The template process: pre-imports the scientific stack once, forks per execution.

Protocol (JSON lines): the pool writes a job per line on stdin; for each job
the template forks a supervisor (``sandbox.supervise``) that writes
``<workdir>/result.json`` and exits; when the template reaps it, it prints
``{"id": ..., "exit": ...}``. The first line it prints is a ready message
with the detected isolation level and the template's own virtual size.

The supervisor also grades the script's submission (``_grade``) when the script exited
cleanly with one, after result.json is on disk and before it reports: in its own process,
never in the trainer's, so a submission that makes parsing slow costs that process, not
the trainer's interpreter and its GIL. Grading runs under two kernel timers that end the
process even inside C code: ``cpu_s`` of CPU time (ITIMER_PROF, SIGPROF: the
submission's doing) and ``wall_s`` of wall-clock time (ITIMER_REAL, SIGALRM: a stalled
host); the pool tells them apart by the exit status.

Run: ``python -m wmrl.autoresearch.env.forkserver [--no-preimport]``.
"""

from __future__ import annotations

import os

# Single-threaded BLAS and no jemalloc background thread, before anything is imported:
# forking a process with live threads is unsafe, and each sandbox slot owns one core. (The
# pool starts us with exactly these in a minimal environment; set here for direct runs.)
os.environ.update(
    OMP_NUM_THREADS="1",
    OPENBLAS_NUM_THREADS="1",
    MKL_NUM_THREADS="1",
    VECLIB_MAXIMUM_THREADS="1",
    NUMEXPR_NUM_THREADS="1",
    JE_ARROW_MALLOC_CONF="background_thread:false",
)

import contextlib
import importlib
import json
import signal
import sys
import traceback

PREIMPORT = (
    "numpy",
    "numpy.random",  # reseeded in every execution: its first import would cost ~30 ms there
    "random",
    "pandas",
    "scipy.sparse",
    "sklearn",
    "sklearn.base",
    "sklearn.compose",
    "sklearn.decomposition",
    "sklearn.dummy",
    "sklearn.ensemble",
    "sklearn.feature_selection",
    "sklearn.impute",
    "sklearn.linear_model",
    "sklearn.metrics",
    "sklearn.model_selection",
    "sklearn.naive_bayes",
    "sklearn.neighbors",
    "sklearn.neural_network",
    "sklearn.pipeline",
    "sklearn.preprocessing",
    "sklearn.svm",
    "sklearn.tree",
)


def _run_supervisor(job: dict) -> None:
    """Body of the forked supervisor: run the job, publish result.json, report early.

    The "done" line goes straight to the pool as soon as the result is on
    disk (a write under PIPE_BUF is atomic among the template's writers), so
    the pool does not wait for the cgroup teardown and this process's exit.
    """
    from wmrl.autoresearch.env import sandbox

    reported = False
    report_fd = os.dup(1)

    def publish(result: dict) -> None:
        nonlocal reported
        _write_json(job["workdir"], "result.json", result)
        if _submission_decides(result):
            _write_json(job["workdir"], "grade.json", _grade(job))
        os.write(report_fd, (json.dumps({"id": job["id"], "exit": 0}) + "\n").encode())
        reported = True

    try:
        sandbox.prctl(sandbox.PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        sandbox.supervise(job, report=publish)
    except BaseException:
        if not reported:
            publish({"infra_error": "supervisor: " + traceback.format_exc(limit=5)})


def _submission_decides(result: dict) -> bool:
    """The script exited cleanly with a submission: its grade is the submission's (what
    ``outcome.script_outcome`` leaves to the grader)."""
    clean = result.get("exit_code") == 0 and result.get("signal") is None
    clean = clean and result.get("timed_out") is False and not result.get("oom_killed")
    clean = clean and not result.get("cut")  # stopped at a cap: nothing of it is graded
    return clean and result.get("submission") == "ok"


def _write_json(directory: str, name: str, value: dict) -> None:
    """Write ``directory/name`` whole or not at all (a temporary file and a rename)."""
    tmp = os.path.join(directory, name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f)
    os.rename(tmp, os.path.join(directory, name))


def _grade(job: dict) -> dict:
    """Grade the copied submission under the job's grading timers and address-space limit:
    ``{"grade": ...}``; ``{"over_memory": MB}`` when grading it needed more memory than
    ``memory_mb`` beyond this process's own (the submission's doing: nothing else runs
    here); ``{"error": traceback}`` when the grader itself failed. Past either timer the
    kernel ends this process (SIGPROF, SIGALRM) and nothing is returned."""
    import resource

    from wmrl.autoresearch.env import grader, sandbox

    request = job["grade"]
    memory_mb = request.get("memory_mb")
    if memory_mb is not None:  # a soft limit: this process is about to exit anyway
        cap = (sandbox._vm_size_mb() + memory_mb) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_PROF, request["cpu_s"])
    signal.setitimer(signal.ITIMER_REAL, request["wall_s"])
    try:
        task = grader.task_from_json(request["task"])
        submission = os.path.join(job["workdir"], "out", "submission.csv")
        return {"grade": grader.grade_submission(task, submission).to_json()}
    except MemoryError:
        return {"over_memory": memory_mb}
    except Exception:
        return {"error": traceback.format_exc(limit=5)}
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    from wmrl.autoresearch.env import linux, sandbox

    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started us
    # exits (the pool may restart us from a worker thread). The pool's death
    # closes our stdin instead; we then finish the running jobs and exit.
    if "--no-preimport" not in sys.argv:
        for name in PREIMPORT:
            try:
                importlib.import_module(name)
            except ImportError:
                continue
    importlib.import_module("wmrl.autoresearch.env.grader")  # once: no import per grading
    importlib.import_module("wmrl.autoresearch.env.competitions.grading")  # imported tasks'
    isolation = sandbox.detect_isolation()
    linux.state_filter()  # built once here, installed by each execution
    base_vm_mb = sandbox._vm_size_mb()
    out = sys.stdout
    # The fork code below assumes this process owns no threads besides this one.
    threads = len(os.listdir("/proc/self/task"))
    hello = {"ready": True, "isolation": isolation, "base_vm_mb": base_vm_mb, "threads": threads}
    out.write(json.dumps(hello))
    out.write("\n")
    out.flush()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    running: dict[int, str] = {}
    buf = b""
    stdin_open = True
    import select

    while stdin_open or running:
        fds = [wake_r] + ([0] if stdin_open else [])
        try:
            ready, _, _ = select.select(fds, [], [], 1.0)
        except InterruptedError:
            ready = []
        if 0 in ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                stdin_open = False
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                job = json.loads(line)
                job["base_vm_mb"] = base_vm_mb
                pid = os.fork()
                if pid == 0:
                    code = 0
                    try:
                        _run_supervisor(job)
                    except BaseException:
                        code = 1
                    os._exit(code)
                running[pid] = job["id"]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            job_id = running.pop(pid, None)
            if job_id is not None:
                msg = {"id": job_id, "exit": os.waitstatus_to_exitcode(status)}
                out.write(json.dumps(msg) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
