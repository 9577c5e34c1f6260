"""One isolated execution of an agent-written script.

Isolation levels (``detect_isolation`` picks the strongest the host allows):

``namespaces`` (root, as in CI):
    Everything in ``rlimits`` plus fresh PID, network, IPC, UTS and mount
    namespaces. The script sees a private root file system holding only
    read-only system directories (/usr, /etc, the Python installation), its
    data read-only at /sandbox/data, a size-capped tmpfs at /sandbox/work
    (cwd, HOME, TMPDIR, /tmp) and a fresh /proc. Protects against: reading the
    private labels or anything else on the host (they are not in its view),
    network access (only a down loopback exists), signalling or even seeing
    host processes (private PID space; the script is PID 1 of it, so when it
    ends or is killed at the time limit the kernel kills every process it
    started, double-fork daemons included), filling the host disk (tmpfs quota), writing outside
    its directory (read-only view), and keeping root (it runs as an unprivileged
    per-slot uid with no_new_privs).

``rlimits`` (fallback when namespaces are unavailable):
    own session / process group, scrubbed environment, no inherited file
    descriptors, a fresh temporary working directory with copies of the public
    data, rlimits (CPU seconds, address space, processes, file size, open
    files, no core dumps), a wall-clock timeout that kills the whole group,
    capped stdout/stderr capture. As root it also drops to a per-slot uid
    (so it cannot signal its supervisor or read 0700 ``private/`` dirs) and
    kills every process of that uid afterwards; each slot works in its own 0700
    directories (cwd, data copies) owned by its uid, inside a work dir that stays
    root's (0711), so the script cannot plant a symlink where root writes by name.
    Does NOT protect against: network access,
    reading world-readable host files, state left in world-writable host
    directories between executions, a daemon that leaves the process group
    when not running as root, and filling the disk with many files each under
    the file-size limit.

Both levels: an allowlisted environment (``base_env``: nothing of the
trainer's, not even on the forked stack), a seccomp filter denying the kernel
keyring syscalls and System V / POSIX-message-queue IPC (keyrings are per uid, and at the
rlimits level IPC objects live in the host's namespace: both would carry state between
executions), per-execution seeds for ``random``/``numpy.random`` in prefork
mode (``execution_seed``), and, without a CPU quota, the slot's own core by
affinity.

``+cgroup`` (either level, where cgroup v1 is writable): a per-execution
memory + pids (+ CPU quota of one core) cgroup caps the total over all the
script's processes (see ``cgroups``); only the script's processes are in it,
not the supervisor; an OOM kill there is graded as a runtime error.

The supervisor (``supervise``) runs in a forked child of the pool's template
process (see ``forkserver``). With ``prefork`` the script itself runs in a fork
of that pre-imported interpreter (numpy/pandas/scikit-learn already loaded),
which removes ~2 s of import time per execution while every isolation step
above still happens in the child before the script's first line.

One file over 600 lines on purpose: the isolation of one execution is one security boundary
(every step before a script's first line, its supervision, its clean-up), read and reviewed
in one place; the kernel primitives are ``linux``'s and the cgroups ``cgroups``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import os
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from wmrl.autoresearch.env import cgroups
from wmrl.autoresearch.env.linux import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUTS,
    MS_NODEV,
    MS_NOSUID,
    MS_PRIVATE,
    MS_REC,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    SANDBOX_DATA,
    SANDBOX_WORK,
    build_root,
    deny_state_syscalls,
    kill_uid,
    live_pids_with_uid,
    mount,
    prctl,
    unshare,
)

UID_BASE = 61000  # sandbox uids need not exist in /etc/passwd
UID_BLOCK = 64  # uids per pool: one per slot
UID_BLOCKS = 32000  # sandbox uids live in [UID_BASE, UID_BASE + UID_BLOCK * UID_BLOCKS)
WORK_INODES = 16384  # files + directories in a namespaces work dir


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits for one execution.

    memory_mb is address space *beyond* the pre-imported interpreter's own
    (numpy/pandas/sklearn reserve several hundred MB of virtual memory before
    the script runs a line), so the budget means the same in every mode.

    grade_cpu_s is the CPU time the grading of its submission may take (by the supervisor,
    ``forkserver._grade``), and grade_memory_mb the address space it may add to the
    supervisor's own (RLIMIT_AS; the supervisor has no other cap); more of either is the
    submission's fault (INVALID_SUBMISSION).
    Grading costs a few microseconds of CPU per row, so the largest honest submission the
    ``submission_mb`` cap admits (a few million rows) fits with room to spare, and a slot
    held that long is no worse than a script that runs to its time limit.
    """

    time_limit_s: float = 60.0
    memory_mb: int = 2048
    nproc: int = 256
    nofile: int = 256
    fsize_mb: int = 256
    disk_mb: int = 256
    submission_mb: int = 32
    output_tail_bytes: int = 4096
    grade_cpu_s: float = 60.0
    grade_memory_mb: int = 4096

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


_ISOLATION: str | None = None


def detect_isolation() -> str:
    """The strongest level this host allows: "namespaces" or "rlimits", plus "+cgroup".

    Probes for real in a throw-away child (unshare + tmpfs mount), so a
    container that forbids it falls back instead of failing every run. The
    "+cgroup" suffix says per-execution memory/pids cgroups (``cgroups.py``)
    cap the total over all of a script's processes.
    """
    level = _detect_base_isolation()
    return level + "+cgroup" if cgroups.available() else level


_PROBE = """
from wmrl.autoresearch.env.linux import (
    CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, MS_PRIVATE, MS_REC, mount, unshare)
unshare(CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC)
mount(None, "/", None, MS_REC | MS_PRIVATE)
mount("tmpfs", "/tmp", "tmpfs", 0, "size=1m")
"""


def _detect_base_isolation() -> str:
    global _ISOLATION
    if _ISOLATION is None:
        _ISOLATION = "rlimits"
        if sys.platform.startswith("linux") and os.geteuid() == 0:
            # Probe in a fresh interpreter rather than a fork of this process: the caller is
            # often a trainer with JAX's threads running, and forking those is unsafe. Its
            # sys.path is the checkout's, never the caller's directory (-P).
            repo_root = str(Path(__file__).resolve().parents[3])
            path = os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p)
            probe = subprocess.run(
                [sys.executable, "-P", "-c", _PROBE],
                capture_output=True,
                timeout=60,
                cwd=repo_root,
                env={**os.environ, "PYTHONPATH": path},
            )
            if probe.returncode == 0:
                _ISOLATION = "namespaces"
    return _ISOLATION


class UidBlock:
    """A block of sandbox uids held by one pool for its lifetime (slot i runs as base + i).

    Claimed with an exclusive ``flock`` on a per-block lock file, so distinct pools (in this
    process or any other on the host) never share a block while they live; the lock goes
    with the pool (or its process, however it dies). A block that still has live processes
    (a crashed pool's stragglers) is skipped. RLIMIT_NPROC, signals and the rlimits-mode uid
    sweep therefore never touch another pool's sandboxes.
    """

    def __init__(self, base: int, lock_fd: int):
        self.base, self._fd = base, lock_fd

    @classmethod
    def claim(cls) -> UidBlock:
        import fcntl

        lock_dir = Path(tempfile.gettempdir()) / f"wmrl-sandbox-uids-{os.geteuid()}"
        with contextlib.suppress(FileExistsError):
            lock_dir.mkdir(mode=0o700)
        # Someone else's directory there (a sandbox script may write to /tmp in rlimits mode)
        # could hold every lock, or plant symlinks for us to open: refuse it.
        info = os.lstat(lock_dir)
        if (
            not stat.S_ISDIR(info.st_mode)
            or info.st_uid != os.geteuid()
            or stat.S_IMODE(info.st_mode) & 0o077
        ):
            raise RuntimeError(
                f"{lock_dir} is not a private directory of uid {os.geteuid()}: remove it"
            )
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        start = (os.getpid() * 7919 + next(_pool_counter)) % UID_BLOCKS
        for i in range(UID_BLOCKS):
            block = (start + i) % UID_BLOCKS
            fd = os.open(lock_dir / f"{block}.lock", flags, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            base = UID_BASE + UID_BLOCK * block
            if live_pids_with_uid(base, base + UID_BLOCK):
                os.close(fd)
                continue
            return cls(base, fd)
        raise RuntimeError("no free sandbox uid block")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


_pool_counter = itertools.count()


def execution_seed(run_seed: int, key: str) -> int:
    """The seed of one execution: a function of the run's seed and the execution's key
    only, so a resumed run that re-executes the same key draws the same numbers."""
    digest = hashlib.sha256(f"{run_seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _reseed(seed: int) -> None:
    """In a prefork script: what a fresh interpreter would do with its own entropy, done
    with the execution's seed. (The hash seed is fixed; see ``base_env``.)"""
    import random

    random.seed(seed)
    nprandom = sys.modules.get("numpy.random")  # pre-imported by the template
    if nprandom is not None:
        nprandom.seed(seed % 2**32)


def _vm_size_mb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) // 1024
    return 0


# Thread caps (each slot owns one core; forking live BLAS threads is unsafe) and the
# template's single-threadedness: pyarrow's bundled jemalloc would otherwise start a
# background thread as soon as pandas loads it.
THREAD_CAPS = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
    "JE_ARROW_MALLOC_CONF": "background_thread:false",
}
# Host settings passed through when set: some hosts need the BLAS core type forced.
HOST_PASSTHROUGH = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def base_env() -> dict[str, str]:
    """The environment every sandbox process starts from, the template included.

    Built from an explicit allowlist, nothing inherited: a prefork script is a fork of the
    template, and the template's original environment strings stay on its stack (where a
    script can read them back with process_vm_readv) whatever os.environ says later. The
    hash seed is fixed (0) in every execution, prefork or fresh interpreter, so set and
    dict iteration orders are reproducible.
    """
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "TZ": "UTC",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        **THREAD_CAPS,
    }
    env.update({k: os.environ[k] for k in HOST_PASSTHROUGH if k in os.environ})
    return env


def _script_env(data_dir: str, work_dir: str) -> dict[str, str]:
    """The whole environment the script gets: nothing inherited from the host."""
    return {
        **base_env(),
        "HOME": work_dir,
        "TMPDIR": os.path.join(work_dir, "tmp"),
        "DATA_DIR": data_dir,
        "SUBMISSION_PATH": os.path.join(work_dir, "submission.csv"),
    }


def _become_script(
    job: dict, uid: int | None, env: dict, out_w: int, err_w: int, ready_w: int
) -> None:
    """In the script's own process: drop privileges and limits, then run it. Never returns.

    One byte on ``ready_w`` marks the moment every isolation step is done:
    a failure before it is the sandbox's (exit 125, infrastructure), after it
    the script's.
    """
    code = 125
    try:
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, ready_w)
        os.closerange(ready_w + 1, 65536)
        # What a fresh interpreter would have (the template changed SIGCHLD).
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        limits = job["limits"]
        cpu = int(limits["time_limit_s"]) + 1
        mem = (job["base_vm_mb"] + limits["memory_mb"]) * 2**20
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a credential change clears it
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        deny_state_syscalls()
        for res, val in (
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, (mem, mem)),
            (resource.RLIMIT_NPROC, (limits["nproc"], limits["nproc"])),
            (resource.RLIMIT_NOFILE, (limits["nofile"], limits["nofile"])),
            (resource.RLIMIT_FSIZE, (limits["fsize_mb"] * 2**20,) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ):
            resource.setrlimit(res, val)
        os.write(ready_w, b"1")
        os.close(ready_w)
        code = 1
        script = os.path.join(os.getcwd(), "script.py")
        if not job["prefork"]:
            os.execve(sys.executable, [sys.executable, "-B", script], env)
        os.environ.clear()
        os.environ.update(env)
        _reseed(job["seed"])
        sys.argv = [script]
        sys.path[0] = os.getcwd()
        import runpy

        code = 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except BaseException as e:
            _print_script_traceback(e, script)
            code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code & 0xFF)


def _print_script_traceback(exc: BaseException, script: str) -> None:
    """Print a traceback that starts at the script's own frames (sandbox frames hidden)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != script:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__)


def _copy_submission(src_path: str, out_dir_fd: int, cap: int) -> str:
    """Copy a regular, non-symlink submission file out of the sandbox.

    Returns "ok", "missing" (no file, a symlink, or not a regular file) or
    "too_large" (over ``cap`` bytes: the grader would otherwise parse a huge
    CSV in the trainer's process).
    """
    try:
        fd = os.open(src_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return "missing"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return "missing"
        if info.st_size > cap:
            return "too_large"
        chunks, total = [], 0
        while total <= cap:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:
            return "too_large"
    finally:
        os.close(fd)
    out = os.open("submission.csv", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=out_dir_fd)
    with os.fdopen(out, "wb") as f:
        f.write(b"".join(chunks))
    return "ok"


def _status_fields(status: int, rusage) -> dict:
    fields = {"exit_code": None, "signal": None, "cpu_s": None, "max_rss_mb": None}
    if os.WIFSIGNALED(status):
        fields["signal"] = os.WTERMSIG(status)
    else:
        fields["exit_code"] = os.WEXITSTATUS(status)
    if rusage is not None:
        fields["cpu_s"] = rusage.ru_utime + rusage.ru_stime
        fields["max_rss_mb"] = rusage.ru_maxrss / 1024
    return fields


class _Tail:
    """Keep the last ``cap`` bytes of a stream and count the total (amortised O(1) work per
    byte: the buffer is trimmed only once it holds twice the cap)."""

    def __init__(self, cap: int):
        self.cap, self.buf, self.total = cap, bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        self.buf += chunk
        if len(self.buf) > 2 * self.cap:
            del self.buf[: len(self.buf) - self.cap]

    def text(self) -> str:
        return bytes(self.buf[-self.cap :] if self.cap else b"").decode("utf-8", errors="replace")


# The supervisor's work per byte of output is bounded: it runs outside the job's one-core
# cgroup, so a script making millions of one-byte writes must not make it spend a select and
# a read on each. A read that returns less than SHORT_READ leaves its pipe unwatched for
# OUTPUT_PAUSE_S while the script's writes collect in the pipe (PIPE_BYTES where the kernel
# allows), so the supervisor wakes at most 1 / OUTPUT_PAUSE_S times a second per stream. A
# script whose output outruns that blocks on its writes, as on a slow terminal.
SHORT_READ = 1 << 15
OUTPUT_PAUSE_S = 0.01
PIPE_BYTES = 1 << 20
READ_BYTES = 1 << 20
F_SETPIPE_SZ = 1031


def _widen_pipe(fd: int) -> None:
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)


def _make_job_cgroup(job: dict):
    """A fresh memory + pids cgroup for the script's processes (not the supervisor's).

    The cap covers the script's memory plus its tmpfs work dir and /dev/shm, with slack.
    The supervisor stays outside it, in the pool's cgroup: whatever the script leaves
    charged to the job (tmpfs pages and inodes outlive their writer), the supervisor's own
    allocations (reading the submission, reporting) never compete with it, so a full job
    cgroup can only OOM-kill the script's processes, and the outcome is always graded.
    Returns None (and the run says so) if the cgroup cannot be made.
    """
    limits = job["limits"]
    mem = (limits["memory_mb"] + limits["disk_mb"] + 16 + 64) * 2**20
    try:
        return cgroups.JobCgroup(
            f"wmrl-{job['id']}", mem, limits["nproc"] + 16, cpu_cores=job.get("cpu_cores", 1.0)
        )
    except OSError:
        return None


def _drain(fds: dict[int, _Tail], until: float) -> None:
    """Read the pipes until EOF or the deadline (a killed sandbox closes them quickly)."""
    open_fds = dict(fds)
    while open_fds:
        left = until - time.monotonic()
        if left <= 0:
            return
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, READ_BYTES)
            if chunk:
                open_fds[fd].add(chunk)
            else:
                del open_fds[fd]


def _prepare_work_dir(job: dict, uid: int | None) -> str:
    """The script's cwd: a size-capped tmpfs (namespaces) or a plain directory."""
    work = os.path.join(job["workdir"], "work")
    os.makedirs(work, mode=0o700)  # rlimits as root: its uid's alone (see pool._open_to_slot)
    if job["isolation"] == "namespaces":
        # Mounted in the supervisor's private mount namespace: the host never
        # sees it and it vanishes with the supervisor.
        owner = f",uid={uid},gid={uid}" if uid is not None else ""
        size = job["limits"]["disk_mb"]
        # Inodes are capped too: they are kernel memory charged to the job, not to size=.
        opts = f"size={size}m,nr_inodes={WORK_INODES},mode=0700{owner}"
        mount("tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    os.makedirs(os.path.join(work, "tmp"))
    shutil.copyfile(os.path.join(job["workdir"], "script.py"), os.path.join(work, "script.py"))
    if uid is not None:
        for p in (work, os.path.join(work, "tmp"), os.path.join(work, "script.py")):
            os.chown(p, uid, uid)
    return work


def _start_script(
    job: dict, uid: int | None, work: str, out_w: int, err_w: int, ready_w: int, cgroup
):
    """Fork the script process and return its pid.

    With namespaces the script is PID 1 of its own PID namespace, so its exit
    (or our SIGKILL) takes every process it started with it. ``ready_w``
    gets one byte once isolation is in place: without it, a failure is the
    sandbox's (infrastructure), not the script's.
    """
    pid = os.fork()
    if pid:
        return pid
    try:
        if cgroup is not None:  # first, so that everything the script does is charged to it
            cgroup.enter()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.setsid()
        if job.get("cpus"):  # no CPU quota here: at least keep to the slot's own core
            os.sched_setaffinity(0, job["cpus"])
        if job["isolation"] == "namespaces":
            build_root(job)
            env = _script_env(SANDBOX_DATA, SANDBOX_WORK)
        else:
            os.chdir(work)
            env = _script_env(job["data_dir"], work)
    except BaseException:
        os.write(err_w, traceback.format_exc().encode())
        os._exit(125)
    _become_script(job, uid, env, out_w, err_w, ready_w)


def supervise(job: dict, report=None) -> dict:
    """Run one job under isolation; return raw outcome fields.

    ``job``: id, workdir (holding script.py and empty out/ and root/),
    data_dir (the public data, read-only to the script), limits
    (``Limits.to_json()``), uid, isolation, cgroup, prefork, and base_vm_mb
    (added by the template); optionally ``cut_s``, a cap below the time limit at
    which the script is stopped and reported ``cut`` (not ``timed_out``).

    Must run in a process that may fork and that owns no threads (a fork of
    the template). The script's status is *not* decided here; the grader
    turns these fields into a ``Status``. ``report``, if given, is called
    with the result before the (slower) cgroup teardown.
    """
    t0 = time.monotonic()
    limits = job["limits"]
    isolation = job["isolation"]
    uid = int(job["uid"]) if os.geteuid() == 0 else None
    cgroup = _make_job_cgroup(job) if job.get("cgroup") else None
    if isolation == "namespaces":
        unshare(CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNS)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    work = _prepare_work_dir(job, uid)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    ready_r, ready_w = os.pipe()
    tails = {out_r: _Tail(limits["output_tail_bytes"]), err_r: _Tail(limits["output_tail_bytes"])}
    for fd in (out_r, err_r):
        _widen_pipe(fd)
    pid = _start_script(job, uid, work, out_w, err_w, ready_w, cgroup)
    for fd in (out_w, err_w, ready_w):
        os.close(fd)
    try:
        exit_fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        exit_fd = None  # old kernel: poll instead
    watched = [out_r, err_r, ready_r] + ([exit_fd] if exit_fd is not None else [])
    deadline = t0 + limits["time_limit_s"]
    # A cap below the limit (`job["cut_s"]`, cost-aware routing): the script is stopped there
    # and reported cut, which is not a time-out (it might have finished within its limit).
    cut_s = job.get("cut_s")
    if cut_s is not None and cut_s < limits["time_limit_s"]:
        deadline = t0 + cut_s
    else:
        cut_s = None
    timed_out, cut, setup_ok, fields = False, False, False, None
    paused: dict[int, float] = {}  # output pipes left unwatched until then (SHORT_READ)
    while fields is None:
        now = time.monotonic()
        if now >= deadline:
            cut = cut_s is not None
            timed_out = not cut
            break
        for fd, until in list(paused.items()):
            if until <= now:
                del paused[fd]
                watched.append(fd)
        wait = deadline - now if exit_fd is not None else min(deadline - now, 0.005)
        if paused:
            wait = max(0.0, min(wait, min(paused.values()) - now))
        for fd in select.select(watched, [], [], wait)[0]:
            if fd == exit_fd:
                continue
            chunk = os.read(fd, READ_BYTES)
            if fd == ready_r:
                setup_ok = setup_ok or chunk == b"1"
            elif chunk:
                tails[fd].add(chunk)
            if not chunk:
                watched.remove(fd)
            elif fd != ready_r and len(chunk) < SHORT_READ:
                watched.remove(fd)
                paused[fd] = now + OUTPUT_PAUSE_S
        got, status, rusage = os.wait4(pid, os.WNOHANG)
        if got == pid:
            fields = _status_fields(status, rusage)
    runtime = time.monotonic() - t0
    if fields is None:  # timed out or cut; with namespaces, killing PID 1 kills them all
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if isolation != "namespaces":
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        if uid is not None:
            kill_uid(uid)
    _drain(tails, time.monotonic() + 1.0)
    for fd in [out_r, err_r, ready_r] + ([exit_fd] if exit_fd is not None else []):
        os.close(fd)
    result = {"exit_code": None, "signal": None, "cpu_s": None, "max_rss_mb": None}
    result.update(fields or {})
    result["infra_error"] = None
    if not setup_ok and not (timed_out or cut):
        result["infra_error"] = "sandbox setup failed: " + tails[err_r].text()[-1000:]
    out_fd = os.open(os.path.join(job["workdir"], "out"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        sub = os.path.join(work, "submission.csv")
        result["submission"] = _copy_submission(sub, out_fd, limits["submission_mb"] * 2**20)
    finally:
        os.close(out_fd)
    if cgroup is not None:
        result["oom_killed"] = cgroup.oom_killed()
    result.update(
        timed_out=timed_out,
        cut=cut,
        runtime_s=runtime,
        stdout_tail=tails[out_r].text(),
        stderr_tail=tails[err_r].text(),
        stdout_bytes=tails[out_r].total,
        stderr_bytes=tails[err_r].total,
        isolation=isolation + ("+cgroup" if cgroup is not None else ""),
    )
    if report is not None:
        report(result)
    if cgroup is not None:
        cgroup.remove()
    return result
