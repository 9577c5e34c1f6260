"""Checks shared by the sandbox tests: no process left under a pool's sandbox uids, and an
`rlimits` pool that says whether its start-up check passed on this host."""

from __future__ import annotations

import time

from wmrl.autoresearch.env import linux, sandbox
from wmrl.autoresearch.env.pool import SandboxPool, SandboxStartupError


def sandbox_pids(pool: SandboxPool) -> list[int]:
    """Live processes owned by one of this pool's sandbox uids (zombies excluded).

    Scoped to the pool's own uid block: other pools on the host (another test
    run, a trainer) use other blocks and must not make these checks flaky.
    """
    return linux.live_pids_with_uid(pool.uid_base, pool.uid_base + sandbox.UID_BLOCK)


def describe(pids: list[int]) -> str:
    """Name, state and uids of leftover processes, for the failure message."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            lines.append(
                f"{pid}: {fields['Name'].strip()} state={fields['State'].strip()} "
                f"uid={fields['Uid'].split()} ppid={fields['PPid'].strip()}"
            )
        except OSError:
            lines.append(f"{pid}: gone")
    return "; ".join(lines)


def assert_no_sandbox_pids(pool: SandboxPool, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while sandbox_pids(pool) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = sandbox_pids(pool)
    assert left == [], f"processes left under the pool's uids: {describe(left)}"


def rlimits_pool(**kw) -> tuple[SandboxPool, bool]:
    """An rlimits pool, and whether its start-up check passed. Where it refuses (the sandbox
    uid cannot read this host's Python installation, e.g. one under a 0700 /root or a 0700
    checkout: `test_startup_check_names_what_the_sandbox_uid_cannot_reach`) the isolation
    tests still run with the check off, but honest scripts are not expected to work."""
    if not _RLIMITS_REFUSED:
        try:
            return SandboxPool(isolation="rlimits", **kw), True
        except SandboxStartupError as e:
            _RLIMITS_REFUSED.append(str(e))  # the host does not change: ask once
    return SandboxPool(isolation="rlimits", startup_check=False, **kw), False


_RLIMITS_REFUSED: list[str] = []
