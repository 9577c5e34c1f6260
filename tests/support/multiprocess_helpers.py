"""Start worker scripts as real JAX processes joined over localhost (multi-process tests)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def xla_flags(devices: int | None) -> str:
    """The suite's XLA flags (tests/conftest.py) with `devices` fake CPU devices instead of its
    8 (None: the platform's one), for a child process."""
    flags = [
        f for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]  # fmt: skip
    if devices is not None:
        flags.append(f"--xla_force_host_platform_device_count={devices}")
    return " ".join(flags)


def run_local_processes(
    worker: str, args: list[str], num_processes: int, devices: int, timeout: float = 240
):
    """Start `num_processes` copies of a worker script joined over localhost; return outputs.

    Each gets `COORDINATOR NUM_PROCESSES PROCESS_ID *args` and `devices` CPU devices; a hang
    fails after `timeout` seconds instead of blocking the suite.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{sock.getsockname()[1]}"
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": xla_flags(devices),
        "PYTHONPATH": str(ROOT),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "support" / worker),
                coordinator,
                str(num_processes),
                str(pid),
                *args,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for pid in range(num_processes)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, text) for p, text in zip(procs, outputs, strict=True)]
