"""Sandbox attacks of the second review round, each run for real through a pool.

Each test plays the attack as a sandboxed script and checks the outcome the fix guarantees;
the shared checks (no process left under a sandbox uid) come from tests/support/sandbox_checks.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import site
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score, make_tiny_task
from tests.support.sandbox_checks import assert_no_sandbox_pids, rlimits_pool
from wmrl.autoresearch.env import sandbox
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.pool import SandboxPool, SandboxStartupError

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
]
REPO = Path(__file__).resolve().parents[3]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids need root")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=5.0)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with SandboxPool(num_workers=2, disk_mb=64, fsize_mb=48, submission_mb=32) as p:
        yield p


def run(pool, task, body: str, **kw):
    return pool.run(task, textwrap.dedent(body), **kw)


def blocked_for_others(path: str) -> list[str]:
    """Directories on `path` that a uid which is not their owner (and in no group) cannot
    traverse: computed here from the mode bits, independently of the pool's own check."""
    p = Path(os.path.realpath(path))
    return [str(d) for d in [*p.parents, p] if d.is_dir() and not d.stat().st_mode & 0o001]


# -- item 8: a checkout (and its virtualenv) in a directory only root can enter --------------


@as_root
def test_startup_check_names_what_the_sandbox_uid_cannot_reach(task):
    """The rlimits fallback runs scripts as an unprivileged uid: where that uid cannot reach
    this interpreter (a 0700 /root holding pyenv, a 0700 checkout) the pool must refuse to
    start, naming the directory, instead of grading every script RUNTIME_ERROR."""
    import numpy

    paths = [sys.executable, sys.prefix, sys.base_prefix, os.__file__, numpy.__file__]
    blocked = sorted({b for p in paths for b in blocked_for_others(p)})
    if blocked:
        with pytest.raises(SandboxStartupError) as err:
            SandboxPool(num_workers=1, isolation="rlimits")
        for b in blocked:
            assert b in str(err.value)
        assert "Permission denied" in str(err.value)  # the canary's own traceback
    else:  # reachable: the fallback starts and a solution's lazy imports work
        with SandboxPool(num_workers=1, isolation="rlimits") as p:
            r = p.run(task, GOOD_SCRIPT + "import wave, colorsys\n")
            assert r.status == Status.VALID, r
            assert r.score == pytest.approx(good_script_score(task))


REPRO = """
import json, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from autoresearch_fixtures import GOOD_SCRIPT, make_tiny_task
from wmrl.autoresearch.env import sandbox
from wmrl.autoresearch.env.pool import SandboxPool, SandboxStartupError

out = {{"prefix": sys.prefix}}
try:
    SandboxPool(1, isolation="rlimits").close()
    out["rlimits"] = "started"
except SandboxStartupError as e:
    out["rlimits"] = str(e)
if sandbox.detect_isolation().startswith("namespaces"):
    task = make_tiny_task(Path({task_dir!r}))
    with SandboxPool(1) as p:
        r = p.run(task, GOOD_SCRIPT + "import wave, colorsys\\n")
        out["namespaces"] = [r.status.name, r.score, r.stderr_tail[-500:]]
print(json.dumps(out))
"""


@pytest.mark.slow  # ~10 s; the fast suite has test_startup_check_names_what_the_sandbox_uid...
@as_root
def test_a_virtualenv_inside_a_0700_directory(tmp_path, task):
    """What CI does (`d=$(mktemp -d)`, clone, `.venv` inside): a virtualenv in a directory
    only root may enter. The namespaces sandbox mounts the installation into its own view, so
    honest scripts (scikit-learn on a DataFrame, lazy imports) score exactly as anywhere; the
    rlimits fallback cannot reach it and refuses, naming the directory."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    venv = private / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # This interpreter's libraries, through a .pth file (as --system-site-packages would).
    (pth_dir,) = venv.glob("lib/python3*/site-packages")
    (pth_dir / "wmrl_test.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    code = REPRO.format(
        tests=str(Path(__file__).resolve().parents[2] / "support"),
        task_dir=str(tmp_path / "t" / "tiny"),
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["prefix"] == str(venv)
    assert str(private) in out["rlimits"] and "mode 0700" in out["rlimits"], out["rlimits"]
    if "namespaces" in out:
        status, score, stderr = out["namespaces"]
        assert status == "VALID", stderr
        expected = good_script_score(make_tiny_task(tmp_path / "again" / "tiny"))
        assert score == pytest.approx(expected)


# -- item 1: the trainer's environment must not reach a prefork execution ------------------

STACK_READER = r"""
import ctypes, os, re
# An environment entry: NUL, NAME=, a printable value, NUL (random stack bytes that merely
# look like "\0JRD=" are not one: seen once in CI).
ENV_STRING = re.compile(rb"(?<=\x00)([A-Z_][A-Z0-9_]{1,63})=[\x20-\x7e]*(?=\x00)")

def names(blob):
    return {m.group(1).decode() for m in ENV_STRING.finditer(b"\x00" + blob)}

seen = {"os.environ": set(os.environ)}
try:  # the kernel's copy of the original environment block (root-owned once non-dumpable)
    seen["environ"] = names(open("/proc/self/environ", "rb").read())
except OSError as e:
    print("environ-denied", e.errno)
# The stack, read back as the reviewer's attacker did: process_vm_readv on itself.
line = next(l for l in open("/proc/self/maps") if l.rstrip().endswith("[stack]"))
lo, hi = (int(x, 16) for x in line.split()[0].split("-"))

class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

libc = ctypes.CDLL(None, use_errno=True)
libc.process_vm_readv.restype = ctypes.c_ssize_t
buf = ctypes.create_string_buffer(hi - lo)
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), hi - lo), iovec(lo, hi - lo)
got = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
seen["stack"] = names(buf.raw[: max(got, 0)])
try:  # and through /proc/self/mem
    with open("/proc/self/mem", "rb") as f:
        f.seek(lo)
        seen["mem"] = names(f.read(hi - lo))
except OSError as e:
    seen["mem"] = set()
    print("mem-denied", e.errno)
print("stack-bytes", got)
for where, found in seen.items():
    print(where, " ".join(sorted(found)))
"""


def test_no_trainer_environment_reaches_a_prefork_script(task, monkeypatch):
    """A secret in the trainer's environment when the pool starts: the script finds it
    neither in /proc/self/environ nor anywhere on its stack (the template's original
    environment block, which clearing os.environ leaves in place)."""
    name = "WMRL_SECRET_" + os.urandom(6).hex().upper()
    value = os.urandom(12).hex()
    monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", value)
    with SandboxPool(num_workers=1) as p:
        r = p.run(task, STACK_READER)
        template_threads = os.listdir(f"/proc/{p._template.proc.pid}/task")
    assert r.status == Status.NO_SUBMISSION, r
    out = dict(line.split(" ", 1) for line in r.stdout_tail.splitlines() if " " in line)
    assert int(out["stack-bytes"]) > 4096, r.stdout_tail  # the stack really was read
    stack = set(out["stack"].split())
    environ = set(out["os.environ"].split())
    # Positive control: the template's own (allowlisted) environment block is on the stack.
    assert "PATH" in stack and "OMP_NUM_THREADS" in stack, r.stdout_tail
    script_only = {"TMPDIR", "DATA_DIR", "SUBMISSION_PATH"}
    allowed = set(sandbox.base_env()) | {"HOME", "PYTHONPATH"} | script_only
    for where in ("stack", "environ", "mem", "os.environ"):
        found = set(out.get(where, "").split())
        assert name not in found and "AWS_SECRET_ACCESS_KEY" not in found, where
        assert found <= allowed, f"{where}: not allowlisted {sorted(found - allowed)}"
    assert environ == set(sandbox.base_env()) | {"HOME"} | script_only
    assert value not in r.stdout_tail and value not in r.stderr_tail
    # item 13: the template owns one thread (no jemalloc background thread) when it forks.
    assert len(template_threads) == 1, template_threads


# -- item 2: a submission that makes grading (in the trainer's process) slow or huge ---------


def test_submission_headers_that_would_stall_the_grader(pool, task):
    """The script writes a 100,000-column header, then a 16 MB one: INVALID_SUBMISSION in
    a bounded time (the grader checks the header before parsing anything)."""
    for header in (
        '",".join(f"c{i}" for i in range(100_000)) + ",id,label"',
        '"id,label," + "x" * (16 * 2**20)',
    ):
        t0 = time.monotonic()
        r = run(
            pool,
            task,
            f"""
            import os
            import pandas as pd
            te = pd.read_csv(os.path.join(os.environ["DATA_DIR"], "test.csv"))
            rows = "".join(f"{{i}},yes\\n" for i in te["id"])
            with open(os.environ["SUBMISSION_PATH"], "w") as f:
                f.write({header} + "\\n" + rows)
            """,
        )
        assert r.status == Status.INVALID_SUBMISSION and "header" in r.detail, r
        assert time.monotonic() - t0 - r.runtime_s < 3.0  # the grading part


# -- item 3: a script must not be able to make its own run UNGRADED --------------------------


def test_a_job_cgroup_left_full_cannot_starve_the_supervisor(task):
    """The script fills its job's memory cgroup with what outlives it (tmpfs inodes and
    pages), writes an honest submission and exits 0. The supervisor, which reads and
    reports the submission afterwards, must not be OOM-killed: the run is graded (never
    retried as an infrastructure failure and returned UNGRADED)."""
    attack = GOOD_SCRIPT + textwrap.dedent("""
        import os
        n = 0
        try:
            while True:  # empty files: inodes and dentries, charged to the job's memory
                open(f"f{n}", "w").close()
                n += 1
        except OSError as e:
            print("files", n, e.errno)
        try:
            with open("/dev/shm/fill", "wb") as f:
                while True:
                    f.write(b"x" * 2**20)
        except OSError:
            pass
    """)
    with SandboxPool(num_workers=1, memory_mb=64, disk_mb=32) as p:
        r = p.run(task, attack)
        if "+cgroup" not in p.isolation:
            pytest.skip("no job cgroups on this host")
    assert r.attempts == 1 and r.status != Status.UNGRADED, r
    assert r.status == Status.VALID, r
    assert r.score == pytest.approx(good_script_score(task))
    assert "files" in r.stdout_tail  # it ran to the end: the inode cap stopped it, not OOM


@as_root
def test_only_the_scripts_processes_are_in_the_job_cgroup(pool, task):
    """While a script runs, every process of its job cgroup runs as the sandbox uid."""
    from wmrl.autoresearch.env import cgroups

    if "+cgroup" not in pool.isolation:
        pytest.skip("no job cgroups on this host")
    fut = pool.submit(task, "import time\ntime.sleep(3)\n")
    own = cgroups._own_dir("memory")

    def uids_in_job_cgroups() -> list[int]:
        uids = []
        for d in own.glob("wmrl-*"):
            for pid in (d / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    status = Path(f"/proc/{pid}/status").read_text().splitlines()
                    uids.append(int(next(ln for ln in status if ln[:4] == "Uid:").split()[1]))
        return uids

    # Until the script has dropped to its uid (its set-up runs as root, inside the cgroup).
    deadline, uids = time.monotonic() + 10, []
    while time.monotonic() < deadline:
        uids = uids_in_job_cgroups()
        if uids and min(uids) >= sandbox.UID_BASE:
            break
        time.sleep(0.05)
    assert uids and min(uids) >= sandbox.UID_BASE, f"uids in the job cgroup: {uids}"
    assert fut.result().status == Status.NO_SUBMISSION


# -- item 4: kernel keyrings (per uid, not namespaced) and uid blocks ------------------------

KEYRING = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": (248, 250), "aarch64": (217, 219)}[__import__("platform").machine()]
KEY_SPEC_USER_KEYRING, KEYCTL_SEARCH = -4, 10
if MODE == "write":
    r = libc.syscall(NR[0], b"user", b"wmrl-leak", b"from the last execution", 23,
                     KEY_SPEC_USER_KEYRING)
else:
    r = libc.syscall(NR[1], KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, b"user", b"wmrl-leak", 0)
print(MODE, r, ctypes.get_errno())
"""


def test_keyrings_carry_nothing_between_executions(task):
    """One execution stores a key in its uid's keyring, the next one in the same slot looks
    for it: the keyring syscalls are denied (EPERM), so there is nothing to find."""
    import platform

    if platform.machine() not in ("x86_64", "aarch64"):
        pytest.skip("keyring syscall numbers known for x86_64 and aarch64 only")
    with SandboxPool(num_workers=1) as p:
        wrote = p.run(task, 'MODE = "write"\n' + KEYRING)
        read = p.run(task, 'MODE = "read"\n' + KEYRING)
    assert wrote.stdout_tail.split() == ["write", "-1", "1"], wrote
    assert read.stdout_tail.split() == ["read", "-1", "1"], read


def test_uid_blocks_are_distinct_between_pools_and_processes():
    """Blocks once collided for pids p and p + 2000 and for a process's 1st and 17th pool."""
    blocks = [sandbox.UidBlock.claim() for _ in range(20)]
    code = (
        "from wmrl.autoresearch.env import sandbox\n"
        "print(*[sandbox.UidBlock.claim().base for _ in range(20)])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    try:
        mine = [b.base for b in blocks]
        theirs = [int(x) for x in other.stdout.split()]
        assert len(set(mine)) == 20 and len(set(theirs)) == 20
        assert not set(mine) & set(theirs)  # ours are held: the other process skips them
        for base in mine + theirs:
            assert sandbox.UID_BASE <= base < sandbox.UID_BASE + sandbox.UID_BLOCK * 32000
            assert (base - sandbox.UID_BASE) % sandbox.UID_BLOCK == 0
    finally:
        for b in blocks:
            b.release()
    again = sandbox.UidBlock.claim()  # released blocks are free again
    again.release()


# -- item 5: one CPU core per execution --------------------------------------------------------

SPIN = """
import os, time
t0 = time.monotonic()
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() - t0 < 2.5:
            pass
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
t = os.times()
print("cpu", t.children_user + t.children_system, "wall", time.monotonic() - t0)
"""


def test_a_script_gets_one_cpu_core(pool, task):
    """Two spinning children used 7.97 CPU-seconds in 4 s on both cores; the cap (a CPU
    quota in the job cgroup, which affinity changes cannot lift) holds them to one."""
    from wmrl.autoresearch.env import cgroups

    if not cgroups.cpu_available():
        pytest.skip("no CPU cgroup on this host: only affinity, which a script can widen")
    widen = "os.sched_setaffinity(0, range(os.cpu_count()))\n"  # undo the slot's pinning
    r = run(pool, task, SPIN.replace("kids = []\n", "kids = []\n" + widen))
    assert r.status == Status.NO_SUBMISSION, r
    words = r.stdout_tail.split()
    cpu, wall = float(words[1]), float(words[3])
    assert wall >= 2.5
    assert cpu / wall < 1.2, r.stdout_tail


# -- item 6: a prefork execution is seeded like a fresh interpreter, reproducibly -------------

DRAWS = """
import random
import numpy as np
print(repr(np.random.rand()), repr(random.random()), hash("wmrl"))
"""


def test_prefork_executions_are_reseeded_per_execution(task):
    """numpy.random and random once returned the template's state in every execution. Now
    each execution draws from its own seed (run seed, execution key): different between
    executions, identical when a new pool (a resumed run) re-executes the same keys."""
    with SandboxPool(num_workers=1, seed=7) as p:
        first = [p.run(task, DRAWS).stdout_tail for _ in range(3)]
        keyed = [p.run(task, DRAWS, key="step-3/7").stdout_tail for _ in range(2)]
    with SandboxPool(num_workers=1, seed=7) as p:
        resumed = [p.run(task, DRAWS).stdout_tail for _ in range(3)]
        resumed_keyed = p.run(task, DRAWS, key="step-3/7").stdout_tail
    np_draws = [line.split()[0] for line in first]
    py_draws = [line.split()[1] for line in first]
    assert len(set(np_draws)) == 3 and len(set(py_draws)) == 3, first
    assert resumed == first
    assert keyed[0] == keyed[1] == resumed_keyed and keyed[0] not in first
    # The hash seed is fixed (PYTHONHASHSEED=0), the same as in a fresh interpreter.
    fresh = subprocess.run(
        [sys.executable, "-c", 'print(hash("wmrl"))'],
        capture_output=True,
        text=True,
        env={"PYTHONHASHSEED": "0"},
        check=True,
    )
    assert {line.split()[2] for line in first} == {fresh.stdout.strip()}


# -- item 7: rlimits fallback, slots must not read each other's work dirs ----------------------

# Plain file I/O only: where the rlimits start-up check refuses (the slot uid cannot read the
# installation) the isolation is still tested, but lazy imports (pandas' to_csv) would fail.
VICTIM = """
import os, time
with open(os.path.join(os.environ["DATA_DIR"], "test.csv")) as f:
    ids = [line.split(",")[0] for line in f.read().splitlines()[1:]]
with open(os.environ["SUBMISSION_PATH"], "w") as f:
    f.write("id,label\\n" + "".join(f"{i},yes\\n" for i in ids))
time.sleep(4)
"""

THIEF = """
import os, time
mine = os.path.basename(os.path.dirname(os.getcwd()))
others = []
t0 = time.monotonic()
while not others and time.monotonic() - t0 < 3.5:
    others = [d for d in os.listdir(WORKROOT) if d != mine and d.startswith("tiny-")]
    time.sleep(0.05)
print("sibling", bool(others))
for d in others:
    for attempt in ("listdir", "copy"):
        try:
            if attempt == "listdir":
                os.listdir(os.path.join(WORKROOT, d))
            else:
                src = os.path.join(WORKROOT, d, "work", "submission.csv")
                with open(src, "rb") as f, open(os.environ["SUBMISSION_PATH"], "wb") as g:
                    g.write(f.read())
            print("stolen", attempt)
        except OSError as e:
            print("denied", attempt, e.errno)
"""


@as_root
def test_rlimits_slots_cannot_read_each_others_work_dirs(task):
    """A thief copied its sibling's submission and scored it VALID. Each slot's directory
    is now its own uid's, mode 0700: the thief sees the sibling's name, nothing inside."""
    p, _ = rlimits_pool(num_workers=2)
    with p:
        victim = p.submit(task, VICTIM)
        thief = p.submit(task, f"WORKROOT = {p._workroot!r}\n" + THIEF)
        v, t = victim.result(), thief.result()
        own = p.run(
            task,
            "import os\nfor d in ('.', '..'):\n"
            "    s = os.stat(d)\n    print(d, s.st_uid, oct(s.st_mode & 0o777))\n",
        )
        uid = p.uid_base
    assert v.status == Status.VALID, v
    assert "sibling True" in t.stdout_tail, t.stdout_tail
    assert "stolen" not in t.stdout_tail, t.stdout_tail
    assert "denied listdir 13" in t.stdout_tail and "denied copy 13" in t.stdout_tail
    assert t.status == Status.NO_SUBMISSION, t
    # The script's own directory is the slot uid's, 0700; its parent root's, 0711 (passable,
    # not listable, no entry the script could add or replace: pool._open_to_slot).
    lines = dict(line.split(" ", 1) for line in own.stdout_tail.splitlines())
    assert lines["."] in (f"{uid} 0o700", f"{uid + 1} 0o700"), own.stdout_tail
    assert lines[".."] == "0 0o711", own.stdout_tail
    assert_no_sandbox_pids(p)


# -- item 12: a killed trainer's leftovers are removed by the next pool ------------------------

TRAINER = """
import sys, time
sys.path.insert(0, {tests!r})
from pathlib import Path
from autoresearch_fixtures import make_tiny_task
from wmrl.autoresearch.env.pool import SandboxPool
task = make_tiny_task(Path({task_dir!r}), time_limit_s=60.0)
pool = SandboxPool(1)
pool.submit(task, "import time\\ntime.sleep(60)\\n")
time.sleep(1.0)
print(pool._workroot, pool.owner, flush=True)
time.sleep(600)
"""


@as_root
def test_a_killed_trainers_leftovers_are_removed_by_the_next_pool(pool, tmp_path):
    """SIGKILL to a trainer's whole process group mid-execution leaves its work root and
    its job cgroups behind; the next pool's start removes them (their owner is dead), and
    leaves a live pool's alone."""
    from wmrl.autoresearch.env import cgroups

    code = TRAINER.format(
        tests=str(Path(__file__).resolve().parents[2] / "support"), task_dir=str(tmp_path / "tiny")
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    trainer = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        workroot, owner = trainer.stdout.readline().split()
    finally:
        os.killpg(trainer.pid, 9)
        trainer.wait()
    job_cgroups = []
    if cgroups.available():
        job_cgroups = [d for d in cgroups._own_dir("memory").glob(f"wmrl-{owner}-*")]
        assert job_cgroups, "the killed trainer's running job had no cgroup"
    # Its sandbox dies with its supervisor (parent-death signal); wait for the cgroup to empty.
    deadline = time.monotonic() + 10
    while any((d / "cgroup.procs").read_text().strip() for d in job_cgroups if d.exists()):
        assert time.monotonic() < deadline, "the killed trainer's sandbox is still running"
        time.sleep(0.05)
    assert os.path.isdir(workroot)
    with SandboxPool(num_workers=1, startup_check=False) as fresh:
        cleaned = fresh.cleaned
    assert workroot in cleaned and not os.path.exists(workroot)
    for d in job_cgroups:
        assert not d.exists(), d
    assert os.path.isdir(pool._workroot)  # a live pool's work root is left alone


def test_a_planted_uid_lock_dir_is_refused(tmp_path, monkeypatch):
    """Attacker's review of item 4: the uid-block lock directory lives in the temp dir, where
    an rlimits-mode script (or any user) could create it first and hold every lock or plant
    symlinks. A directory that is not ours and private is refused, naming it."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = tmp_path / f"wmrl-sandbox-uids-{os.geteuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    with pytest.raises(RuntimeError, match="not a private directory"):
        sandbox.UidBlock.claim()
    planted.rmdir()
    planted.symlink_to(tmp_path)
    with pytest.raises(RuntimeError, match="not a private directory"):
        sandbox.UidBlock.claim()
    planted.unlink()
    block = sandbox.UidBlock.claim()  # made by us, 0700: fine
    block.release()
    assert stat.S_IMODE(planted.stat().st_mode) == 0o700


@as_root
def test_leftover_sweep_leaves_other_owners_dirs_alone(tmp_path):
    """Attacker's review of item 12: a directory named like a dead pool's work root but made by
    another uid (a sandbox script, a user) is not ours to delete; ours with a dead owner is."""
    from wmrl.autoresearch.env.pool import clean_dead_owners

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tag = f"{dead.pid}.1"  # pid gone (or reused: then its start time differs)
    theirs, ours = tmp_path / f"wmrl-sandbox-{tag}-a", tmp_path / f"wmrl-sandbox-{tag}-b"
    theirs.mkdir()
    ours.mkdir()
    (theirs / "file").write_text("x")
    os.chown(theirs, 65534, 65534)
    (tmp_path / "wmrl-sandbox-link").symlink_to(theirs)
    removed = clean_dead_owners(str(tmp_path))
    assert removed == [str(ours)] and not ours.exists()
    assert (theirs / "file").exists()
