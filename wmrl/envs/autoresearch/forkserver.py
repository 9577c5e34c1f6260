"""The template process: pre-imports the scientific stack once, forks per execution.

Protocol (JSON lines): the pool writes a job per line on stdin; for each job
the template forks a supervisor (``sandbox.supervise``) that writes
``<workdir>/result.json`` and exits; when the template reaps it, it prints
``{"id": ..., "exit": ...}``. The first line it prints is a ready message
with the detected isolation level and the template's own virtual size.

A job with a ``grade`` field grades a submission instead (``_run_grader``), in a fork of
this process rather than in the trainer's: a submission that makes parsing slow (or a
bug that makes it hang) costs that fork, never the trainer's interpreter and its GIL. The
fork has a CPU-time budget (``cpu_s``, ITIMER_PROF: the kernel ends it with SIGPROF, even
inside C code) and the template kills it with SIGKILL at a wall-clock deadline
(``wall_s``); the pool tells the two apart by the exit status.

Run: ``python -m wmrl.envs.autoresearch.forkserver [--no-preimport]``.
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
import time
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
    from wmrl.envs.autoresearch import sandbox

    reported = False
    report_fd = os.dup(1)

    def publish(result: dict) -> None:
        nonlocal reported
        tmp = os.path.join(job["workdir"], "result.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(result, f)
        os.rename(tmp, os.path.join(job["workdir"], "result.json"))
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


def _run_grader(job: dict) -> None:
    """Body of a forked grading process: grade ``job["grade"]`` and write the answer.

    The answer (``{"grade": Grade.to_json()}``, or ``{"error": traceback}`` when the
    grader itself failed) goes to ``out`` through a temporary file and a rename, so the
    pool reads a whole answer or none. Exceeding ``cpu_s`` of CPU time ends the process
    with SIGPROF before it writes anything.
    """
    from wmrl.envs.autoresearch import grader

    request = job["grade"]
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # the template's stdout is the pool's protocol channel
    signal.setitimer(signal.ITIMER_PROF, request["cpu_s"])
    try:
        task = grader.task_from_json(request["task"])
        answer = {"grade": grader.grade_submission(task, request["submission"]).to_json()}
    except Exception:
        answer = {"error": traceback.format_exc(limit=5)}
    signal.setitimer(signal.ITIMER_PROF, 0)
    tmp = request["out"] + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(answer, f)
    os.rename(tmp, request["out"])


def _fork_job(job: dict) -> int:
    """Fork the job's process (a supervisor, or a grader for a ``grade`` job); its pid."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if "grade" in job:
                _run_grader(job)
            else:
                _run_supervisor(job)
        except BaseException:
            code = 1
        os._exit(code)
    return pid


def main() -> None:
    from wmrl.envs.autoresearch import linux, sandbox

    # No PR_SET_PDEATHSIG here: it fires when the *thread* that started us
    # exits (the pool may restart us from a worker thread). The pool's death
    # closes our stdin instead; we then finish the running jobs and exit.
    if "--no-preimport" not in sys.argv:
        for name in PREIMPORT:
            try:
                importlib.import_module(name)
            except ImportError:
                continue
    importlib.import_module("wmrl.envs.autoresearch.grader")  # once: no import per grading
    isolation = sandbox.detect_isolation()
    linux.keyring_filter()  # built once here, installed by each execution
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
    deadlines: dict[int, float] = {}  # grading forks: pid -> monotonic time to kill it
    buf = b""
    stdin_open = True
    import select

    while stdin_open or running:
        fds = [wake_r] + ([0] if stdin_open else [])
        wait = min([1.0, *(t - time.monotonic() for t in deadlines.values())])
        try:
            ready, _, _ = select.select(fds, [], [], max(wait, 0.0))
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
                pid = _fork_job(job)
                running[pid] = job["id"]
                if "grade" in job:
                    deadlines[pid] = time.monotonic() + job["grade"]["wall_s"]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        for pid, deadline in list(deadlines.items()):
            if time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                del deadlines[pid]
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            job_id = running.pop(pid, None)
            deadlines.pop(pid, None)
            if job_id is not None:
                msg = {"id": job_id, "exit": os.waitstatus_to_exitcode(status)}
                out.write(json.dumps(msg) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
