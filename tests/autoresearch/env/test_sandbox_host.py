"""What a sandboxed script could do to the host beyond its own execution, each attack played
for real: a module planted where a root process imports from, a hard link or a symbolic link
that reaches the hidden labels, and output that makes the supervisor (outside the job's
cgroup) burn a core. The Ray half of the host (an rlimits sandbox beside a Ray node) is in
test_ray_executor.py, next to its cluster."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score, make_tiny_task
from tests.support.sandbox_checks import rlimits_pool
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.pool import SandboxPool, SandboxStartupError
from wmrl.autoresearch.env.task import TaskError, load_task
from wmrl.benchmarks.sandbox import BYTE_WRITES, supervisor_cpu

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox"),
]
REPO = Path(__file__).resolve().parents[3]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="per-slot uids need root")
PLANTED = ("json", "typing", "numpy", "absl")  # what the entry points import first


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=10.0)


def plant(directory: Path) -> Path:
    """Modules that, imported, write a marker (what an attacker's json.py would do as root)."""
    marker = directory / "imported-as"
    for name in PLANTED:
        (directory / f"{name}.py").write_text(
            f"import os\nopen({str(marker)!r}, 'a').write('{name}:%d ' % os.geteuid())\n"
        )
    return marker


def shared_dir(tmp_path: Path) -> Path:
    """A directory every user can write, as /tmp is (sticky, 1777)."""
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


# -- a planted module ----------------------------------------------------------------------


def test_the_template_never_imports_from_the_callers_directory(tmp_path, task, monkeypatch):
    """The pool's template (every execution's parent, root) starts with a safe sys.path and
    its own working directory: modules in the directory the trainer was started from are
    never imported by it, even where that directory is one only we can write."""
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    marker = plant(own)
    monkeypatch.chdir(own)
    with SandboxPool(1) as pool:
        r = pool.run(task, GOOD_SCRIPT)
    assert r.status == Status.VALID, r
    assert r.score == pytest.approx(good_script_score(task))
    assert not marker.exists(), marker.read_text()


def test_a_command_started_in_a_shared_directory_imports_nothing_planted_there(tmp_path, task):
    """`python -m wmrl.autoresearch.env.run` in a directory every user can write (a script
    at the rlimits level can write /tmp): what is planted there is not imported, and the
    execution is graded as anywhere else."""
    cwd = shared_dir(tmp_path)
    marker = plant(cwd)
    script = cwd / "solution.py"
    script.write_text(GOOD_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "wmrl.autoresearch.env.run", f"--task={task.root}",
         f"--script={script}"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1])["status"] == "VALID"
    assert not marker.exists(), marker.read_text()
    assert f"not importing modules from {cwd}" in proc.stderr


@as_root
def test_rlimits_refuses_a_working_directory_others_can_write(tmp_path, task, monkeypatch):
    """The attack: at the rlimits level a script (a sandbox uid) writes json.py into the
    trainer's working directory when others can write it; the next process started there
    imports it as root. The level now refuses to start there, naming the directory, through
    the pool and through the command line (one line, exit 2)."""
    cwd = shared_dir(tmp_path)
    monkeypatch.chdir(cwd)
    with pytest.raises(SandboxStartupError, match=rf"{cwd} \(mode 1777\) is writable by every"):
        SandboxPool(1, isolation="rlimits", startup_check=False)
    script = cwd / "solution.py"
    script.write_text(f"open({str(cwd / 'json.py')!r}, 'w').write('raise SystemExit(9)')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "wmrl.autoresearch.env.run", f"--task={task.root}",
         f"--script={script}", "--isolation=rlimits"],
        cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and str(cwd) in error[0], proc.stderr[-2000:]
    assert not (cwd / "json.py").exists()


# -- links to the hidden labels --------------------------------------------------------------


def test_load_task_refuses_a_public_hard_link_to_the_labels(tmp_path):
    root = make_tiny_task(tmp_path / "linked").root
    os.link(root / "private" / "test_labels.csv", root / "public" / "extra.csv")
    with pytest.raises(TaskError, match=r"public/extra\.csv is a hard link to .*test_labels"):
        load_task(root)


@as_root
def test_staging_never_widens_a_files_mode(tmp_path):
    """rlimits as root copies public/ for the slot: a public name for a 0600 file (a hard link
    made after the task was loaded) must stay unreadable to the sandbox uid, as it is under
    the namespaces level's bind mount. Only preloaded modules are used by the script, so it
    runs even where the sandbox uid cannot read this host's Python installation."""
    task = make_tiny_task(tmp_path / "late-link")
    os.link(task.labels_path, task.public_dir / "extra.csv")
    os.chmod(task.public_dir / "train.csv", 0o640)
    body = """
        import os
        d = os.environ["DATA_DIR"]
        for name in ("extra.csv", "train.csv", "test.csv"):
            try:
                open(os.path.join(d, name)).read(1)
                print(name, "read")
            except PermissionError:
                print(name, "denied")
            print(name, oct(os.stat(os.path.join(d, name)).st_mode & 0o777))
    """
    pool, _ = rlimits_pool(num_workers=1)
    with pool:
        r = pool.run(task, textwrap.dedent(body))
    out = r.stdout_tail.split()
    assert "extra.csv denied" in r.stdout_tail, r
    assert out[out.index("extra.csv") + 3] == "0o600"  # the labels' own mode
    assert out[out.index("train.csv") + 3] == "0o640"  # never wider than the original
    assert "test.csv read" in r.stdout_tail, r


def test_load_task_refuses_links_in_private_and_changes_nothing_outside(tmp_path):
    """A symbolic link in private/ was followed and its target chmod-ed 0600 (a link to
    /etc/passwd would break the host). Now refused, naming it; the target keeps its mode."""
    outside = tmp_path / "host-file.csv"
    outside.write_text("id,label\n1,0\n")
    os.chmod(outside, 0o644)
    root = make_tiny_task(tmp_path / "symlinked").root
    os.symlink(outside, root / "private" / "extra.csv")
    with pytest.raises(TaskError, match=r"private/extra\.csv is a symbolic link"):
        load_task(root)
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644
    (root / "private" / "extra.csv").unlink()
    labels = root / "private" / "test_labels.csv"
    os.replace(labels, tmp_path / "labels.csv")
    os.symlink(tmp_path / "labels.csv", labels)
    os.chmod(tmp_path / "labels.csv", 0o644)
    with pytest.raises(TaskError, match=r"test_labels\.csv is a symbolic link"):
        load_task(root)
    assert stat.S_IMODE((tmp_path / "labels.csv").stat().st_mode) == 0o644


def test_load_task_refuses_a_private_dir_that_is_a_link(tmp_path):
    root = make_tiny_task(tmp_path / "private-link").root
    os.replace(root / "private", tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", root / "private")
    with pytest.raises(TaskError, match=r"private is a symbolic link"):
        load_task(root)


# -- output that burns the supervisor's core --------------------------------------------------


def test_one_byte_writes_cost_the_supervisor_little(task):
    """A script making a write per byte made the supervisor (outside the job's one-core
    cgroup) spend a select and a read on each: about as much CPU as the script's run time.
    Its CPU is now bounded per wake-up, not per byte: here under a fifth of the run time
    (the 0.1 s floor is the /proc clock's granularity and a loaded machine's slack), and the
    stream still arrives whole (its count and its tail)."""
    with SandboxPool(1) as pool:
        cpu, written, r = supervisor_cpu(pool, task, BYTE_WRITES.format(seconds=1.5))
    assert r.status == Status.NO_SUBMISSION, r
    assert written > 100_000, r.stderr_tail
    assert r.stdout_tail.endswith("x" * 1000)
    assert cpu < max(0.1, 0.2 * r.runtime_s), (cpu, written, r.runtime_s)


# -- state left in the host's IPC namespace ---------------------------------------------------

IPC_PROBE = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
calls = {
    "shmget": lambda: libc.shmget(KEY, 4096, 0o1666),  # IPC_CREAT | 0666
    "semget": lambda: libc.semget(KEY + 1, 1, 0o1666),
    "msgget": lambda: libc.msgget(KEY + 2, 0o1666),
    "mq_open": lambda: libc.mq_open(b"/wmrl-probe", 0o102, 0o666, None),  # O_CREAT | O_RDWR
}
for name, call in calls.items():
    ctypes.set_errno(0)
    print(name, call(), ctypes.get_errno())
"""


def _ipc_rows(kind: str, key: int) -> list[str]:
    with open(f"/proc/sysvipc/{kind}") as f:
        return [line for line in f if line.split()[0] in (str(key), f"{key:#x}")]


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="syscall numbers")
@pytest.mark.parametrize("level", ["auto", "rlimits"])
def test_no_ipc_object_outlives_an_execution(task, level):
    """At the rlimits level System V shared memory, semaphores and message queues, and POSIX
    message queues, live in the host's IPC namespace: one execution could leave data for
    the next (or for a later task's script). Creating any of them fails with EPERM at every
    level (ctypes is imported by the template, so this runs where the rlimits uid cannot
    read the installation too); nothing with the probe's keys is left on the host."""
    key = 0x57A1 + (0 if level == "auto" else 16)
    pool, _ = rlimits_pool(num_workers=1) if level == "rlimits" else (SandboxPool(1), True)
    try:
        with pool:
            r = pool.run(task, f"KEY = {key}\n" + IPC_PROBE)
        lines = dict(line.split(" ", 1) for line in r.stdout_tail.strip().splitlines())
        assert set(lines) == {"shmget", "semget", "msgget", "mq_open"}, r
        for name, out in lines.items():
            assert out.split() == ["-1", "1"], (name, out)  # -1, errno EPERM
        for kind, k in (("shm", key), ("sem", key + 1), ("msg", key + 2)):
            assert _ipc_rows(kind, k) == []
    finally:  # what an unfixed sandbox leaves behind
        for flag, k in (("-M", key), ("-S", key + 1), ("-Q", key + 2)):
            subprocess.run(["ipcrm", flag, hex(k)], capture_output=True)
        import ctypes

        ctypes.CDLL(None).mq_unlink(b"/wmrl-probe")


# -- the supervisor's memory while it grades --------------------------------------------------

HOG = """
import json, sys
from wmrl.autoresearch.env import forkserver, grader

def hog(task, path):  # a grading that needs 1 GiB (what a metric's k x k matrices did)
    block = bytearray(2**30)
    return grader.Grade(grader.Status.VALID, 1.0, 1.0, 1.0, "ok")

grader.grade_submission, grader.task_from_json = hog, lambda d: None
job = {"workdir": "/nonexistent", "grade": {"task": {}, "cpu_s": 30, "wall_s": 60,
       "memory_mb": int(sys.argv[1])}}
print(json.dumps(forkserver._grade(job)))
"""


@pytest.mark.parametrize("memory_mb, answer", [(64, {"over_memory": 64}), (4096, "grade")])
def test_grading_has_an_address_space_limit(memory_mb, answer):
    """The supervisor grades outside any cgroup; a grading that needs more than
    `grade_memory_mb` beyond the supervisor's own address space fails in that process with
    MemoryError, reported as over_memory (INVALID, the submission's doing), not as the
    grader's failure (UNGRADED) or the host's OOM killer."""
    proc = subprocess.run(
        [sys.executable, "-c", HOG, str(memory_mb)], capture_output=True, text=True,
        timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got == answer if isinstance(answer, dict) else set(got) == {answer}, got


def test_over_memory_is_an_invalid_submission(tmp_path):
    from wmrl.autoresearch.env.outcome import submission_grade
    from wmrl.autoresearch.env.sandbox import Limits

    (tmp_path / "grade.json").write_text(json.dumps({"over_memory": 64}))
    g = submission_grade(Limits(grade_memory_mb=64), "ok", tmp_path, over_budget=False)
    assert g.status == Status.INVALID_SUBMISSION and g.reward == 0.2
    assert "within 64 MB of memory" in g.detail


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, 2**21])
def test_grade_memory_mb_is_checked_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"grade_memory_mb="):
        SandboxPool(1, grade_memory_mb=bad)
