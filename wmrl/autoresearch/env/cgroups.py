"""Per-execution cgroups (v1 memory + pids): a total cap over *all* of a script's processes.

rlimits are per process: a script that forks 200 children, each under its
address-space limit, could still exhaust the host's memory. A job cgroup caps
the sum (memory.limit_in_bytes) and the process count (pids.max); an OOM kill
inside it is reported so the grader calls it a runtime error.

The job cgroup is created *inside the supervisor's own cgroup* (so whoever
accounts for this process tree still accounts for the sandboxes), is entered
by the script's process first thing after its fork (its children inherit it; the
supervisor stays outside, so what the script leaves charged there cannot starve it), and
is removed when the execution is over. Only cgroup v1 hierarchies are used; on a
host without them (or without permission) the sandbox runs without this layer
and says so in its isolation level.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids")


def _own_dir(controller: str) -> Path | None:
    """This process's cgroup directory for a v1 controller, if mounted."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, names, rel = line.rstrip("\n").split(":", 2)
                if controller in names.split(","):
                    path = ROOT / controller / rel.lstrip("/")
                    return path if path.is_dir() else None
    except OSError:
        return None
    return None


_AVAILABLE: bool | None = None


def available() -> bool:
    """True if we may create job cgroups for both controllers (probed once)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = False
        dirs = [_own_dir(c) for c in CONTROLLERS]
        if all(dirs) and os.geteuid() == 0:
            probe = [d / f"wmrl-probe-{os.getpid()}" for d in dirs]
            try:
                for p in probe:
                    p.mkdir()
                _AVAILABLE = (probe[0] / "memory.limit_in_bytes").exists() and (
                    probe[1] / "pids.max"
                ).exists()
            except OSError:
                _AVAILABLE = False
            finally:
                for p in probe:
                    with contextlib.suppress(OSError):
                        p.rmdir()
    return _AVAILABLE


_CPU: bool | None = None
CFS_PERIOD_US = 100_000


def cpu_available() -> bool:
    """True if job cgroups also get a CPU quota (the v1 cpu controller is writable)."""
    global _CPU
    if _CPU is None:
        _CPU = False
        own = _own_dir("cpu")
        if own is not None and available():
            probe = own / f"wmrl-probe-{os.getpid()}"
            try:
                probe.mkdir()
                _CPU = (probe / "cpu.cfs_quota_us").exists()
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    probe.rmdir()
    return _CPU


class JobCgroup:
    """One execution's memory + pids (+ cpu quota) cgroup, made by the supervisor and
    entered by the script's process."""

    def __init__(self, name: str, memory_bytes: int, pids_max: int, cpu_cores: float = 1.0):
        controllers = CONTROLLERS + (("cpu",) if cpu_available() else ())
        self.parents = {c: _own_dir(c) for c in controllers}
        self.dirs = {c: p / name for c, p in self.parents.items()}
        for d in self.dirs.values():
            d.mkdir()
        (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):  # only where swap accounting is on
            (self.dirs["memory"] / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        (self.dirs["pids"] / "pids.max").write_text(str(pids_max))
        if "cpu" in self.dirs:  # a hard cap over all its processes: affinity can be undone
            (self.dirs["cpu"] / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
            quota = max(1000, int(cpu_cores * CFS_PERIOD_US))
            (self.dirs["cpu"] / "cpu.cfs_quota_us").write_text(str(quota))

    def enter(self) -> None:
        """Move the calling process (and so its future children) into the job cgroup: the
        script's process, before it does anything, never its supervisor."""
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(os.getpid()))

    def oom_killed(self) -> bool:
        try:
            text = (self.dirs["memory"] / "memory.oom_control").read_text()
        except OSError:
            return False
        fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(fields.get("oom_kill", 0)) > 0

    def remove(self, timeout: float = 2.0) -> None:
        """Delete the job's cgroups (once its processes are gone; the caller is outside)."""
        deadline = time.monotonic() + timeout
        for d in self.dirs.values():
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.001)


def remove_stale(name: str, timeout: float = 3.0) -> None:
    """Delete a job cgroup its supervisor could not (it was killed): called by the pool.

    The pool's template is its child, so they share cgroups and the path is
    the same as the supervisor's parent. Only empty cgroups can be removed,
    so a live sandbox is never touched.
    """
    deadline = time.monotonic() + timeout
    for controller in (*CONTROLLERS, "cpu"):
        parent = _own_dir(controller)
        while parent is not None:
            try:
                (parent / name).rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # its processes are still being killed
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)


def remove_dead_owners(alive) -> list[str]:
    """Remove job cgroups (``wmrl-<owner tag>-<job>``) and probes (``wmrl-probe-<pid>``)
    whose owner is dead, under this process's own cgroups; ``alive(tag)`` decides (None:
    not a tag, leave it). Only empty cgroups can be removed, so a live job is never
    touched. Returns the names removed."""
    removed = []
    for controller in (*CONTROLLERS, "cpu"):
        parent = _own_dir(controller)
        if parent is None:
            continue
        for d in parent.glob("wmrl-*"):
            rest = d.name[len("wmrl-") :]
            tag = rest.split("-", 1)[0] if not rest.startswith("probe-") else None
            if tag is not None and alive(tag) is not False:
                continue
            if tag is None:
                pid = rest[len("probe-") :]
                if not pid.isdigit() or os.path.exists(f"/proc/{pid}"):
                    continue
            with contextlib.suppress(OSError):
                d.rmdir()
                removed.append(f"{controller}/{d.name}")
    return removed
