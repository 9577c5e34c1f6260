"""A pool of sandbox slots with an async API, so execution overlaps with JAX work.

    with SandboxPool(num_workers=4) as pool:
        futures = pool.submit_batch([(task, script), ...])
        for fut in pool.as_completed(futures):
            result = fut.result()          # ExecutionResult, never raises
        pool.free_slots()                  # anchor routing caps its budget by this

Every execution is forked from one template process (``forkserver``) that
has numpy/pandas/scikit-learn imported; its supervisor, that fork, also grades
its submission: no submission is ever parsed in the trainer's interpreter,
whose threads therefore keep running whatever a submission holds. Infrastructure
failures (the template died, a supervisor or the grader crashed, the work dir
could not be built) are retried once and otherwise returned as
``Status.UNGRADED``, which the trainer masks out; agent failures are never
retried. How a finished execution's report becomes its graded result is
``wmrl.autoresearch.env.outcome``'s.

One file over 600 lines on purpose: it is the trainer's side of the sandbox boundary (the
startup canary, the template process, each slot's folders and permissions, the pool), which
an audit reads with ``sandbox`` as one piece.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import queue
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from wmrl.autoresearch.env import cgroups, linux, sandbox
from wmrl.autoresearch.env.grader import (
    MAX_SCRIPT_BYTES,
    Status,
    check_script,
    reward,
    task_to_json,
)
from wmrl.autoresearch.env.outcome import (
    cut_result,
    execution_result,
    script_outcome,
    submission_grade,
    supervisor_exit,
)
from wmrl.autoresearch.env.result import ExecutionResult, InfrastructureError
from wmrl.autoresearch.env.sandbox import Limits
from wmrl.autoresearch.env.task import MAX_MEMORY_MB, Task


class SandboxStartupError(RuntimeError):
    """The pool's start-up check failed: every execution would be mis-graded, so none run."""


# The start-up check: what a solution does (pandas on the data, scikit-learn on a DataFrame,
# numpy), plus reads a library never imported by the template, as any solution's lazy import
# (e.g. scikit-learn's DataFrame interchange code) does. Prints the marker only if all of it
# works as the sandbox uid, in the sandbox's own view of the file system.
CANARY = """
import importlib, os, sys
import numpy as np
import pandas as pd
import scipy
import sklearn
from sklearn.ensemble import RandomForestClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

for module in (os, importlib, np, pd, scipy, sklearn):
    with open(module.__file__, "rb") as f:
        f.read(1)
for name in ("colorsys", "wave", "tomllib", "graphlib", "zipapp"):
    if name not in sys.modules:
        importlib.import_module(name)
        break
d = os.environ["DATA_DIR"]
train = pd.read_csv(os.path.join(d, "train.csv"))
test = pd.read_csv(os.path.join(d, "test.csv"))
X, y = train[["a", "b"]], train["y"]
model = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y)
RandomForestClassifier(n_estimators=3, random_state=0).fit(X, y)
pred = model.predict(test[["a", "b"]])
pd.DataFrame({"id": test["id"], "y": pred}).to_csv(os.environ["SUBMISSION_PATH"], index=False)
print("wmrl-canary-ok", float(np.mean(pred)))
"""


def _canary_task(root: Path) -> Task:
    """A 40-row task (y = a > 0), written here rather than by make_task (no leaderboard)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"id": np.arange(40), "a": rng.normal(size=40), "b": rng.normal(size=40)})
    df["y"] = (df["a"] > 0).astype(int)
    (root / "public").mkdir(parents=True)
    (root / "private").mkdir(mode=0o700)
    df[:30].to_csv(root / "public" / "train.csv", index=False)
    df[30:].drop(columns=["y"]).to_csv(root / "public" / "test.csv", index=False)
    df[30:][["id", "y"]].to_csv(root / "private" / "test_labels.csv", index=False)
    (root / "public" / "description.md").write_text("start-up check\n")
    return Task(
        root=root,
        id="canary",
        type="classification",
        metric_name="accuracy",
        target="y",
        id_column="id",
        time_limit_s=60.0,
        memory_mb=1024,
        provenance={},
        split="train",
        reference_scores=(0.5,),
    )


def unreachable_paths(paths: Iterable[str]) -> list[str]:
    """The directories on these paths that a uid other than their owner cannot traverse.

    Sandbox uids are in no group and own nothing on the host, so only the "other"
    permission bits count. Every blocking directory is named (each one needs fixing).
    """
    found = set()
    for path in paths:
        p = Path(os.path.realpath(path))
        for d in [p, *p.parents] if p.is_dir() else list(p.parents):
            with contextlib.suppress(OSError):
                mode = d.stat().st_mode
                if not mode & 0o001:
                    found.add(f"{d} (mode {mode & 0o777:04o})")
    return sorted(found)


def _installation_paths() -> list[str]:
    """Where a script's imports come from: the interpreter, stdlib and site-packages."""
    import sysconfig

    import numpy
    import pandas
    import sklearn

    paths = [sys.executable, sys.prefix, sys.base_prefix]
    paths += [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += [os.path.dirname(m.__file__) for m in (numpy, pandas, sklearn)]
    return [p for p in paths if p and os.path.exists(p)]


# The template's working directory: one no sandbox uid can write (checked at the rlimits level).
TEMPLATE_CWD = "/"


def other_writable(path: str) -> str | None:
    """Why a uid other than its owner (a sandbox uid above all) could create a file in the
    directory ``path``, or None: world-writable (the sticky bit does not stop new files),
    or owned by a sandbox uid."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IWOTH:
        return f"{path} (mode {mode:04o}) is writable by every user"
    lo, hi = sandbox.UID_BASE, sandbox.UID_BASE + sandbox.UID_BLOCK * sandbox.UID_BLOCKS
    if lo <= info.st_uid < hi:
        return f"{path} belongs to the sandbox uid {info.st_uid}"
    return None


def rlimits_hazards() -> list[str]:
    """What a script at the rlimits level (same network namespace and file system as the
    trainer, run as a sandbox uid when we are root) could turn into code run by us.

    - A directory Python imports from that the sandbox uid can write: the working directory
      (``python -m`` and ``-c`` put it first on sys.path, so a planted ``json.py`` runs in
      the next command started there), every other sys.path entry and the template's cwd.
    - A Ray node on this host: its GCS, raylet and worker ports are reachable from the
      sandbox, and Ray runs what it is sent as the user that runs Ray.
    """
    found = []
    dirs = [os.getcwd(), TEMPLATE_CWD] + [p or os.getcwd() for p in sys.path]
    for d in dict.fromkeys(os.path.realpath(p) for p in dirs):
        why = other_writable(d)
        if why:
            found.append(
                f"{why}: a script could plant a module that a later process "
                "started there imports as this user"
            )
    ray = {
        (port, os.path.basename(argv[0]))
        for port, _, argv in linux.tcp_listeners()
        if linux.is_ray_process(argv)
    }
    ray = sorted(ray, key=lambda p: (p[1] not in linux.RAY_DAEMONS, p))  # the GCS, raylet first
    if ray:
        ports = ", ".join(f"{port} ({name})" for port, name in ray[:8])
        found.append(
            f"a Ray node listens on this host at TCP port {ports}{' ...' if len(ray) > 8 else ''}"
            ": a script shares the host's network here and could submit tasks to it, which "
            "Ray runs as its own user"
        )
    return found


class _TemplateProcess:
    """The forkserver child and a reader thread that wakes waiting jobs."""

    def __init__(self, preimport: bool, home: str):
        repo_root = str(Path(__file__).resolve().parents[3])
        # Nothing of the trainer's environment: every script is a fork of this process. Its
        # sys.path is the installation and the checkout, never the caller's directory (-P,
        # and a working directory of its own): a module planted where the trainer was
        # started (at the rlimits level a script can write /tmp) is never imported as root.
        env = {**sandbox.base_env(), "HOME": home, "PYTHONPATH": repo_root}
        cmd = [sys.executable, "-P", "-m", "wmrl.autoresearch.env.forkserver"]
        if not preimport:
            cmd.append("--no-preimport")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
            cwd=TEMPLATE_CWD,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise InfrastructureError("sandbox template process failed to start")
        hello = json.loads(line)
        if hello.get("threads", 1) != 1:
            self.close()
            raise SandboxStartupError(
                f"the sandbox template runs {hello['threads']} threads after its imports "
                "(forking it would copy locks held by threads that do not exist in the "
                "child); a library started a thread at import time"
            )
        self.isolation: str = hello["isolation"]
        self.base_vm_mb: int = hello["base_vm_mb"]
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[threading.Event, list]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._lock:
                waiter = self._waiting.pop(msg["id"], None)
            if waiter:
                waiter[1].append(msg["exit"])
                waiter[0].set()
        with self._lock:  # template died: wake everyone with no exit code
            for event, _ in self._waiting.values():
                event.set()
            self._waiting.clear()

    def run(self, job: dict, timeout: float) -> int:
        """Send a job, wait for its process to report; its exit code (0: done)."""
        event, box = threading.Event(), []
        with self._lock:
            if not self.alive():
                raise InfrastructureError("sandbox template process is not running")
            self._waiting[job["id"]] = (event, box)
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        if not event.wait(timeout) or not box:
            raise InfrastructureError("supervisor did not report back")
        return box[0]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def clean_dead_owners(parent: str) -> list[str]:
    """Remove what killed pools left behind: ``wmrl-sandbox-<owner>-*`` work roots under
    ``parent`` and ``wmrl-<owner>-*`` job cgroups, whose owner process (pid + start time)
    is gone. A live owner's, another uid's, or anything not named this way, is left
    alone."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if not entry.name.startswith("wmrl-sandbox-") or not entry.is_dir(
                follow_symlinks=False
            ):
                continue
            if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
                continue  # not one we could have made: someone else's, left alone
            tag = entry.name[len("wmrl-sandbox-") :].rsplit("-", 1)[0]
            if linux.owner_alive(tag) is False:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    if cgroups.available():
        removed += cgroups.remove_dead_owners(linux.owner_alive)
    return removed


def _open_to_slot(workdir: Path, data_dir: Path, uid: int) -> None:
    """rlimits as root: let the slot's uid reach its data copies and its cwd
    (``workdir/work``, made 0700 and its own by the supervisor), and nothing else.

    The work dir stays ours, mode 0711: the script may pass through it but neither list it
    nor add, rename or replace an entry, so the files that root processes write or read
    there by name afterwards (result.json, out/, the submission copy) cannot be symlinks
    it planted. Its script (0600), out/ (0700) and the data copies (in a 0700 directory of
    the slot's uid) stay unreadable to a sibling slot, which runs as another uid.
    """
    os.chmod(workdir, 0o711)
    os.chown(data_dir, uid, uid)


def _copy_public(public: Path, data_dir: Path) -> None:
    """Copy what the namespaces level would bind-mount: every file and directory of the task's
    ``public/`` (a built task's train.csv, test.csv and description.md; an imported
    competition's other files too). Symbolic links are copied as links, never followed, so a
    link planted in ``public/`` cannot copy a file the sandbox uid could not read itself; and
    no copy is readable by more users than its original (``_stage_file``)."""
    for entry in sorted(public.iterdir()):
        if entry.is_symlink():
            os.symlink(os.readlink(entry), data_dir / entry.name)
        elif entry.is_dir():
            shutil.copytree(entry, data_dir / entry.name, symlinks=True, copy_function=_stage_file)
        elif entry.is_file():
            _stage_file(entry, data_dir / entry.name)


def _stage_file(src: str | Path, dst: str | Path) -> None:
    """Copy one file for the sandbox, its permission bits never wider than the original's
    (and no execute or set-id bit): root copies what the sandbox uid may read only if it could
    have read the original, so a public name for a 0600 file (a hard link to the labels) stays
    unreadable to it, as under the namespaces level's bind mount."""
    mode = stat.S_IMODE(os.stat(src).st_mode) & 0o644
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    os.chmod(dst, mode)  # os.open's mode is narrowed by the umask, never widened


def _check_traversable(path: str) -> None:
    """rlimits mode runs scripts as an unprivileged uid that must reach its work dir."""
    p = Path(path)
    for parent in [p, *p.parents]:
        if not parent.stat().st_mode & 0o001:
            raise ValueError(
                f"rlimits sandbox: {parent} is not world-traversable, so the sandbox uid "
                "cannot reach its work dir; pass a workroot such as the system temp dir"
            )


class SandboxPool:
    """N sandbox slots (default: number of cores) fed from a thread pool.

    Args:
      num_workers: concurrent executions.
      isolation: "auto" (strongest available), "namespaces" or "rlimits".
      prefork: run scripts in a fork of the pre-imported template (fast) rather
        than exec-ing a fresh interpreter (slow start-up, same isolation).
      workroot: where per-execution temp dirs are made (default: system tmp).
      limits: overrides for ``sandbox.Limits``; the task's own time and memory
        limits apply unless overridden here.
      time_limit_cap_s: caps every task's own time limit (e.g. a quick experiment on a
        suite whose tasks allow minutes); None keeps the tasks' limits.
      seed: the run's seed; each execution's ``random`` / ``numpy.random`` state is seeded
        from it and the execution's key (``submit``), so unseeded scripts vary between
        executions like fresh interpreters and repeat exactly when a resumed run
        re-executes the same key.
      startup_check: run the canary script (``CANARY``) once through the sandbox before
        accepting work and raise ``SandboxStartupError`` (naming the paths the sandbox uid
        cannot reach) if it fails: otherwise every script of a broken setup would score
        RUNTIME_ERROR and RL would train on garbage. Turn it off only to test the isolation
        of a setup known to fail it.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        isolation: str = "auto",
        prefork: bool = True,
        workroot: str | None = None,
        time_limit_cap_s: float | None = None,
        startup_check: bool = True,
        seed: int = 0,
        **limit_overrides,
    ):
        self.num_workers = num_workers or os.cpu_count() or 1
        self.prefork = prefork
        _check_limit_overrides(limit_overrides)
        self.seed = int(seed)
        self._limit_overrides = limit_overrides
        self._time_limit_cap_s = time_limit_cap_s
        self._submitted: dict[tuple[str, str], int] = {}
        # Named after this process (pid + start time): a later pool removes it if we are
        # killed before close() (clean_dead_owners), and never while we live.
        self.owner = linux.owner_tag()
        self.cleaned = clean_dead_owners(workroot or tempfile.gettempdir())
        self._workroot = tempfile.mkdtemp(prefix=f"wmrl-sandbox-{self.owner}-", dir=workroot)
        os.chmod(self._workroot, 0o755)
        # Each slot's core, where no job cgroup CPU quota caps a script at one core (a script
        # can widen its affinity; pinning under a quota would only add scheduling latency).
        cpus = sorted(os.sched_getaffinity(0))
        pin = not (cgroups.available() and cgroups.cpu_available())
        self._slot_cpus = [[cpus[i % len(cpus)]] if pin else [] for i in range(self.num_workers)]
        self._template_lock = threading.Lock()
        self._template = _TemplateProcess(prefork, self._workroot)
        host_level, _, cgroup = self._template.isolation.partition("+")
        if isolation not in ("auto", host_level, "rlimits"):
            self.close()
            raise ValueError(
                f"isolation {isolation!r} is not available here "
                f"(host allows {self._template.isolation!r})"
            )
        self._level = host_level if isolation == "auto" else isolation
        self._cgroup = cgroup == "cgroup"
        self.isolation = self._level + ("+cgroup" if self._cgroup else "")
        if self._level == "rlimits":
            hazards = rlimits_hazards()
            if hazards:
                self.close()
                raise SandboxStartupError(
                    "the rlimits sandbox refuses to start on this host: "
                    + "; ".join(hazards)
                    + ". Start from a directory only you can write (not /tmp), stop Ray on "
                    "this host, or use the namespaces isolation (docs/sandbox.md)"
                )
        if self._level == "rlimits" and os.geteuid() == 0:
            _check_traversable(self._workroot)
        if self.num_workers > sandbox.UID_BLOCK:
            raise ValueError(f"at most {sandbox.UID_BLOCK} workers per pool")
        self._uid_block = sandbox.UidBlock.claim()
        self.uid_base = self._uid_block.base
        self._stale_cgroups: list[str] = []
        self._slots: queue.Queue[int] = queue.Queue()
        for i in range(self.num_workers):
            self._slots.put(i)
        self._executor = cf.ThreadPoolExecutor(self.num_workers, thread_name_prefix="sandbox")
        self._pending = 0
        self._pending_lock = threading.Lock()
        if startup_check:
            try:
                self._startup_check()
            except BaseException:
                self.close()
                raise

    def _startup_check(self) -> None:
        """Run ``CANARY`` for real; raise SandboxStartupError naming what is unreachable."""
        canary_root = Path(self._workroot) / "canary-task"
        try:
            task = _canary_task(canary_root)
            # Its own limits: a tight time_limit_cap_s must not fail a loaded machine's check.
            limits = dataclasses.replace(self._limits(task), time_limit_s=120.0)
            r = self._execute(task, CANARY.encode(), "canary", limits)
        finally:
            shutil.rmtree(canary_root, ignore_errors=True)
        if r.status == Status.VALID and "wmrl-canary-ok" in r.stdout_tail:
            return
        msg = (
            f"sandbox start-up check failed ({self.isolation}): the canary script scored "
            f"{r.status.name} ({r.detail}); every execution would be mis-graded."
        )
        blocked = unreachable_paths(_installation_paths()) if self._level == "rlimits" else []
        if blocked and os.geteuid() == 0:
            msg += (
                " The sandbox runs as an unprivileged uid that cannot traverse "
                + ", ".join(blocked)
                + " on the way to the Python installation (interpreter, stdlib or "
                "site-packages). Put the checkout, its virtualenv and the Python they use "
                "under world-traversable directories (chmod o+x), or use the namespaces "
                "isolation (root with CAP_SYS_ADMIN), which mounts the installation into "
                "the sandbox's own view."
            )
        raise SandboxStartupError(msg + "\nstderr of the canary:\n" + r.stderr_tail[-1500:])

    # -- public API ----------------------------------------------------------

    def submit(
        self, task: Task, script: str | bytes, key: str | None = None, cut_s: float | None = None
    ) -> cf.Future:
        """Queue one execution; the future resolves to an ExecutionResult (never raises).

        ``key`` names the execution for its seed (``sandbox.execution_seed(seed, key)``):
        a resumed run that passes the same key gets the same random state. By default it
        is the task id, the script's hash and how many times this pool was given that pair
        before, which is reproducible when the submissions come in the same order.

        ``cut_s``: a cap (seconds) below the task's time limit. A script still running there
        is stopped, its slot freed, and nothing of it graded: the result is ``cut`` (status
        UNGRADED, reward NaN, ``runtime_s`` the seconds it ran), never a TIMEOUT, since it
        might have finished within its limit. At or above the limit it changes nothing.
        """
        if cut_s is not None and not (math.isfinite(cut_s) and cut_s > 0):
            raise ValueError(f"cut_s={cut_s!r}: must be a positive, finite number of seconds")
        source = script.encode("utf-8") if isinstance(script, str) else bytes(script)
        with self._pending_lock:
            self._pending += 1
            if key is None:
                pair = (task.id, hashlib.sha256(source).hexdigest())
                n = self._submitted.get(pair, 0)
                self._submitted[pair] = n + 1
                key = f"{pair[0]}:{pair[1]}:{n}"
        fut = self._executor.submit(self._execute, task, source, key, None, cut_s)
        fut.add_done_callback(self._on_done)
        return fut

    def submit_batch(self, items: Iterable[tuple[Task, str | bytes]]) -> list[cf.Future]:
        return [self.submit(task, script) for task, script in items]

    @staticmethod
    def as_completed(futures: Iterable[cf.Future]) -> Iterator[cf.Future]:
        return cf.as_completed(list(futures))

    def run(self, task: Task, script: str | bytes, key: str | None = None) -> ExecutionResult:
        """Blocking convenience for one execution."""
        return self.submit(task, script, key).result()

    def free_slots(self) -> int:
        """Slots not taken by running or queued executions."""
        with self._pending_lock:
            return max(0, self.num_workers - self._pending)

    def close(self) -> None:
        if hasattr(self, "_executor"):
            self._executor.shutdown(wait=True)
        self._template.close()  # waits for every supervisor to exit
        for name in getattr(self, "_stale_cgroups", []):
            cgroups.remove_stale(name)
        shutil.rmtree(self._workroot, ignore_errors=True)
        if hasattr(self, "_uid_block"):
            self._uid_block.release()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals -----------------------------------------------------------

    def _on_done(self, _fut: cf.Future) -> None:
        with self._pending_lock:
            self._pending -= 1

    def _limits(self, task: Task) -> Limits:
        base = {"time_limit_s": task.time_limit_s, "memory_mb": task.memory_mb}
        base.update(self._limit_overrides)
        if self._time_limit_cap_s:
            base["time_limit_s"] = min(base["time_limit_s"], self._time_limit_cap_s)
        return Limits(**base)

    def _template_for_job(self) -> _TemplateProcess:
        with self._template_lock:
            if not self._template.alive():
                self._template.close()
                self._template = _TemplateProcess(self.prefork, self._workroot)
            return self._template

    def _execute(
        self, task: Task, source: bytes, key: str, limits: Limits | None = None,
        cut_s: float | None = None,
    ) -> ExecutionResult:  # fmt: skip
        t0 = time.monotonic()
        problem = check_script(source)
        if problem is not None:
            return ExecutionResult(
                task.id,
                Status.MALFORMED,
                reward(Status.MALFORMED),
                None,
                None,
                0.0,
                "",
                "",
                self.isolation,
                problem,
            )
        last_error = ""
        for attempt in (1, 2):
            try:
                result = self._attempt(task, source, key, limits or self._limits(task), cut_s)
                return dataclasses.replace(result, attempts=attempt)
            except Exception as e:  # infrastructure: retry once, then UNGRADED
                last_error = f"{type(e).__name__}: {e}"
        return ExecutionResult(
            task.id,
            Status.UNGRADED,
            reward(Status.UNGRADED),
            None,
            None,
            time.monotonic() - t0,
            "",
            "",
            self.isolation,
            last_error,
            attempts=2,
        )

    def _attempt(
        self, task: Task, source: bytes, key: str, limits: Limits, cut_s: float | None = None
    ) -> ExecutionResult:
        slot = self._slots.get()
        workdir = job = None
        reported = False
        uid = self.uid_base + slot
        try:
            prefix = re.sub(r"[^A-Za-z0-9._-]", "_", task.id[:40]) + "-"
            workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=self._workroot))  # 0700
            (workdir / "out").mkdir(mode=0o700)
            (workdir / "root").mkdir()
            if self._level == "namespaces":
                data_dir = task.public_dir  # bind-mounted read-only: nothing to copy
            else:  # the script may run as our own user here: give it copies
                data_dir = workdir / "data"
                data_dir.mkdir(mode=0o700)
                _copy_public(task.public_dir, data_dir)
            fd = os.open(workdir / "script.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(source)
            if self._level == "rlimits" and os.geteuid() == 0:
                _open_to_slot(workdir, data_dir, uid)
            grade_wall_s = GRADE_WALL_FACTOR * limits.grade_cpu_s + GRADE_WALL_SLACK_S
            job = {
                "id": f"{self.owner}-{uuid.uuid4().hex}",
                "workdir": str(workdir),
                "data_dir": str(data_dir),
                "limits": limits.to_json(),
                "slot": slot,
                "uid": uid,
                "isolation": self._level,
                "cgroup": self._cgroup,
                "prefork": self.prefork,
                "seed": sandbox.execution_seed(self.seed, key),
                "cpus": self._slot_cpus[slot],
                "grade": {
                    "task": task_to_json(task),
                    "cpu_s": limits.grade_cpu_s,
                    "memory_mb": limits.grade_memory_mb,
                    "wall_s": grade_wall_s,
                },
            }
            if cut_s is not None and cut_s < limits.time_limit_s:
                job["cut_s"] = float(cut_s)
            timeout = limits.time_limit_s + grade_wall_s + 60
            code = self._template_for_job().run(job, timeout=timeout)
            over_budget = code == -signal.SIGPROF  # killed while grading (result.json written)
            if code != 0 and not over_budget:
                raise InfrastructureError(supervisor_exit(code, grade_wall_s))
            raw = json.loads((workdir / "result.json").read_text())
            if raw.get("infra_error"):
                raise InfrastructureError(raw["infra_error"])
            reported = not over_budget  # a killed supervisor left its job cgroup behind
            if raw.get("cut"):  # stopped at the cap: nothing was graded
                return cut_result(task, raw, job["cut_s"])
            outcome = script_outcome(limits, raw)
            if outcome is None:  # it ran cleanly: its submission decides
                outcome = submission_grade(limits, raw["submission"], workdir, over_budget)
            return execution_result(task, raw, outcome)
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            if self._cgroup and job is not None and not reported:
                # The supervisor removes its own cgroup unless it was killed; a
                # killed one may still be dying, so close() sweeps these again.
                self._stale_cgroups.append(f"wmrl-{job['id']}")
                cgroups.remove_stale(self._stale_cgroups[-1], timeout=0.5)
            self._slots.put(slot)


# The grading's wall-clock deadline: this many times its CPU budget plus the slack, so only
# a stalled host (not a slow submission, which the CPU budget catches) reaches it.
GRADE_WALL_FACTOR = 4.0
GRADE_WALL_SLACK_S = 30.0


def _check_limit_overrides(overrides: dict) -> None:
    """Limits every execution would break on, refused when the pool is made (the field
    named): unknown fields, and a work dir too small for the largest accepted script."""
    try:
        limits = Limits(**overrides)
    except TypeError as e:
        raise ValueError(f"unknown sandbox limit: {e}") from e
    if limits.disk_mb * 2**20 < 4 * MAX_SCRIPT_BYTES:
        raise ValueError(
            f"disk_mb={limits.disk_mb}: the work dir must hold the largest accepted script "
            f"({MAX_SCRIPT_BYTES // 1024} KiB) four times over, at least "
            f"{-(-4 * MAX_SCRIPT_BYTES // 2**20)} MB"
        )
    if isinstance(limits.grade_memory_mb, bool) or not (
        isinstance(limits.grade_memory_mb, int) and 0 < limits.grade_memory_mb <= MAX_MEMORY_MB
    ):
        raise ValueError(
            f"grade_memory_mb={limits.grade_memory_mb!r}: must be a whole number of MB in "
            f"[1, {MAX_MEMORY_MB}]"
        )
    if not (limits.grade_cpu_s > 0 and math.isfinite(limits.grade_cpu_s)):
        raise ValueError(
            f"grade_cpu_s={limits.grade_cpu_s!r}: must be a positive, finite number of seconds"
        )
