"""Thin wrappers over the Linux calls the sandbox needs, and the namespace root view.

ctypes rather than the ``unshare``/``mount`` binaries: no extra process per
execution and no dependency beyond libc.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import importlib.util
import os
import platform
import signal
import struct
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 1, 38, 22
SECCOMP_MODE_FILTER = 2


SANDBOX_DATA = "/sandbox/data"
SANDBOX_WORK = "/sandbox/work"

_libc = ctypes.CDLL(None, use_errno=True)


def check_call(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None):
    enc = lambda s: None if s is None else s.encode()
    check_call(_libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)), f"mount {dst}")


def unshare(flags: int) -> None:
    check_call(_libc.unshare(flags), "unshare")


def prctl(option: int, arg: int) -> None:
    check_call(_libc.prctl(option, arg, 0, 0, 0), "prctl")


def _system_binds() -> list[str]:
    """Host directories the script needs read-only: system libs and the Python install."""
    paths = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/lib32"]
    for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        paths.append(os.path.realpath(p))
    paths.append(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    # Site directories outside the prefixes (a .pth file's, a user site): a script's lazy
    # imports read them. Other sys.path entries (the checkout, the cwd) stay out of view.
    for p in sys.path:
        if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p):
            paths.append(os.path.realpath(p))
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if os.path.lexists(p) and not any(p == q or p.startswith(q + "/") for q in out):
            out.append(p)
    return out


# Data files that installed packages ship and the built-in tasks were derived from (package,
# folder inside it). The tasks' rows are re-derived so that these copies do not give their
# labels away (`suite.py`), and inside the namespace view the folders are also covered by an
# empty read-only tmpfs, so a script cannot even use them as extra training rows.
PACKAGED_DATA = (
    ("sklearn", "datasets/data"),
    ("sklearn", "datasets/descr"),
    ("sklearn", "datasets/images"),
    ("palmerpenguins", "data"),
    ("vega_datasets", "_data"),
)


def packaged_data_dirs() -> list[str]:
    """The `PACKAGED_DATA` folders installed here (found without importing the packages)."""
    out = []
    for package, folder in PACKAGED_DATA:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = os.path.realpath(os.path.join(location, folder))
            if os.path.isdir(path):
                out.append(path)
    return sorted(set(out))


def build_root(job: dict) -> None:
    """In the sandbox's private mount namespace: assemble the script's view and chroot.

    ``<workdir>/work`` must already be the job's size-capped tmpfs (mounted by
    the supervisor, which reads the submission from it afterwards).
    """
    root = os.path.join(job["workdir"], "root")
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=0755")
    # Data, work dir and /tmp first: the Python installation may itself live under /tmp (a
    # checkout or venv there), and its bind must then land inside the job's /tmp, not under it.
    data, work = root + SANDBOX_DATA, root + SANDBOX_WORK
    for d in (data, work, root + "/tmp", root + "/proc"):
        os.makedirs(d)
    mount(job["data_dir"], data, None, MS_BIND)
    mount(None, data, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    mount(os.path.join(job["workdir"], "work"), work, None, MS_BIND)
    mount(work + "/tmp", root + "/tmp", None, MS_BIND)
    for path in _system_binds():
        dst = root + path
        if os.path.islink(path):
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(path), dst)
            continue
        os.makedirs(dst, exist_ok=True)
        mount(path, dst, None, MS_BIND | MS_REC)
        mount(None, dst, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path in packaged_data_dirs():
        if os.path.isdir(root + path):  # inside a bound directory: cover it with nothing
            mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY,
                  "size=4k,nr_inodes=4,mode=0555")  # fmt: skip
    dev = root + "/dev"
    os.makedirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for name in ("null", "zero", "random", "urandom"):
        open(f"{dev}/{name}", "w").close()
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,nr_inodes=1024,mode=1777")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096")
    os.chroot(root)
    os.chdir(SANDBOX_WORK)


def live_pids_with_uid(lo: int, hi: int | None = None) -> list[int]:
    """Live (non-zombie) processes with a real, effective or saved uid in [lo, hi)."""
    hi = lo + 1 if hi is None else hi
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uids = [int(u) for u in fields.get("Uid", "").split()[:3]]
        state = fields.get("State", "").strip()
        if any(lo <= u < hi for u in uids) and not state.startswith(("Z", "X")):
            pids.append(int(entry))
    return pids


def kill_uid(uid: int, timeout: float = 2.0) -> None:
    """Kill every process of a per-slot uid (rlimits mode, as root).

    First a helper running as `uid` calls kill(-1, SIGKILL), which the kernel
    delivers to every process of that uid at once; a process caught forking
    gets it too, so nothing escapes by forking. (A /proc scan alone could miss
    a setsid daemon's grandchild: listed after the scan began, its parent gone
    by the time it was read.) Then scans repeat until none is left, as a
    backstop; RLIMIT_NPROC bounds how many can appear.
    """
    helper = os.fork()
    if helper == 0:  # the caller owns no threads (see sandbox.supervise)
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)  # every process this uid may signal: its own
        except OSError:
            pass
        finally:
            os._exit(0)
    os.waitpid(helper, 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = live_pids_with_uid(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)


# State that outlives an execution outside its view, denied outright: kernel keyrings are per
# uid, not per namespace (a key one execution adds is readable by the next one in the same
# slot, and outlives the pool); System V shared memory, semaphores and message queues and
# POSIX message queues live in the host's IPC namespace at the rlimits level (the namespaces
# level has its own). Python ML code uses none of them (multiprocessing and joblib share
# memory through files). (audit arch, syscall numbers) per machine: add_key, request_key,
# keyctl; shmget, shmat, shmctl, semget, semop, semctl, shmdt, msgget, msgsnd, msgrcv,
# msgctl, semtimedop; mq_open, mq_unlink, mq_timedsend, mq_timedreceive, mq_notify,
# mq_getsetattr.
_DENIED_SYSCALLS = {
    "x86_64": (
        0xC000003E,
        (248, 249, 250, 29, 30, 31, 64, 65, 66, 67, 68, 69, 70, 71, 220, *range(240, 246)),
    ),
    "aarch64": (0xC00000B7, (217, 218, 219, *range(180, 198))),
}


@functools.cache
def state_filter():
    """The seccomp program (built once, in the template, so each execution only installs
    it): the keyring and IPC syscalls of ``_DENIED_SYSCALLS`` fail with EPERM, as does every
    syscall of a foreign ABI (x32, or i386 through int 0x80, with other numbers). None on a
    machine whose syscall numbers are not known here."""
    known = _DENIED_SYSCALLS.get(platform.machine())
    if known is None:
        return None
    arch, numbers = known
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ALLOW / _ERRNO
    # Each check below jumps forward to the final "deny" when it matches.
    checks = [(jge_k, 0x40000000)] + [(jeq_k, nr) for nr in numbers]  # x32 numbers, then ours
    prog = [
        (ld_w_abs, 0, 0, 4),  # A = seccomp_data.arch
        (jeq_k, 1, 0, arch),  # native ABI: skip the next instruction
        (ret_k, 0, 0, deny),
        (ld_w_abs, 0, 0, 0),  # A = seccomp_data.nr
    ]
    prog += [(code, len(checks) - i, 0, k) for i, (code, k) in enumerate(checks)]
    prog += [(ret_k, 0, 0, allow), (ret_k, 0, 0, deny)]
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    return buf, SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))


def deny_state_syscalls() -> bool:
    """Install the seccomp filter (``state_filter``) on the calling process.

    Needs no_new_privs (or CAP_SYS_ADMIN); inherited by children and kept across execve.
    Returns False on a machine whose syscall numbers are not known here.
    """
    built = state_filter()
    if built is None:
        return False
    ret = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(built[1]), 0, 0)
    check_call(ret, "seccomp")
    return True


def process_start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live process, None if there is none:
    with the pid, an identity that a reused pid does not share."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])  # field 22 of stat(5); fields here start at field 3


def owner_tag() -> str:
    """ "<pid>.<start time>" of this process: names what it leaves on the host (work dirs,
    job cgroups) so that a later process can tell whether the owner is still alive."""
    return f"{os.getpid()}.{process_start_time(os.getpid())}"


def owner_alive(tag: str) -> bool | None:
    """Whether the process named by ``owner_tag`` is alive; None if ``tag`` is not one."""
    pid, _, start = tag.partition(".")
    if not (pid.isascii() and pid.isdigit() and start.isascii() and start.isdigit()):
        return None
    return process_start_time(int(pid)) == int(start)


def tcp_listeners() -> list[tuple[int, int | None, list[str]]]:
    """Every TCP socket listening in this network namespace (IPv4 and IPv6), as (port, the
    pid holding it or None where its owner is not readable to us, that process's command
    line), from /proc/net and the processes' file descriptors."""
    inodes: dict[str, int] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(name) as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A":  # LISTEN
                    inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    owners: dict[str, int] = {}
    if inodes:
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        link = os.readlink(f"/proc/{pid}/fd/{fd}")
                        if link.startswith("socket:[") and link[8:-1] in inodes:
                            owners[link[8:-1]] = pid
    out = []
    for inode, port in inodes.items():
        pid = owners.get(inode)
        argv: list[str] = []
        if pid is not None:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        out.append((port, pid, argv))
    return sorted(out, key=lambda t: (t[0], t[1] or 0))


RAY_DAEMONS = ("raylet", "gcs_server", "plasma_store")


def is_ray_process(argv: list[str]) -> bool:
    """A Ray daemon or worker, by its command line: the raylet, the GCS, a worker (argv[0]
    ``ray::...``) or a Python process running a module of the ``ray`` package (the client
    server, the dashboard, default workers)."""
    if not argv:
        return False
    if os.path.basename(argv[0]) in RAY_DAEMONS or argv[0].startswith("ray::"):
        return True
    return any(
        "/site-packages/ray/" in a or "/dist-packages/ray/" in a or a.startswith("ray.")
        for a in argv[1:]
    )
