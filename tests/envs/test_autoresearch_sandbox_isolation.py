"""Sandbox attacks of the second review round (issue 19), each run for real through a pool.

Each test plays the attack as a sandboxed script and checks the outcome the fix guarantees;
the shared checks (no process left under a sandbox uid) come from test_autoresearch_sandbox.
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
from autoresearch_fixtures import GOOD_SCRIPT, good_script_score, make_tiny_task

from wmrl.envs.autoresearch import sandbox
from wmrl.envs.autoresearch.grader import Status
from wmrl.envs.autoresearch.pool import SandboxPool, SandboxStartupError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")
REPO = Path(__file__).resolve().parents[2]
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
from wmrl.envs.autoresearch import sandbox
from wmrl.envs.autoresearch.pool import SandboxPool, SandboxStartupError

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
    code = REPRO.format(tests=str(Path(__file__).parent), task_dir=str(tmp_path / "t" / "tiny"))
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
ENV_STRING = re.compile(rb"(?<=\x00)([A-Z_][A-Z0-9_]{1,63})=")

def names(blob):
    return {m.group(1).decode() for m in ENV_STRING.finditer(b"\x00" + blob)}

seen = {"os.environ": set(os.environ)}
try:  # the kernel's copy of the original environment block (root-owned once non-dumpable)
    seen["environ"] = names(open("/proc/self/environ", "rb").read())
except OSError as e:
    print("environ-denied", e.errno)
# The stack, read back as the issue's attacker did: process_vm_readv on itself.
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
    from wmrl.envs.autoresearch import cgroups

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
