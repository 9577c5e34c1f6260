"""Grading and script-size attacks, run for real through the pool.

A submission is graded by the execution's supervisor (a fork of the pool's template
process) under a CPU-time budget, never in the trainer's interpreter: a submission built
to make parsing slow must neither stall the trainer's threads nor become a reward. Scripts
over the size cap are MALFORMED before anything is copied into the sandbox.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import textwrap
import threading
import time

import numpy as np
import pandas as pd
import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score, make_tiny_task
from wmrl.autoresearch.env import pool as pool_module
from wmrl.autoresearch.env.grader import MAX_SCRIPT_BYTES, Status
from wmrl.autoresearch.env.make_task import write_task
from wmrl.autoresearch.env.pool import SandboxPool
from wmrl.autoresearch.env.task import load_task

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not os.sys.platform.startswith("linux"), reason="Linux sandbox"),
]

GRADE_CPU_S = 0.25  # a tight grading budget: a 300,000-row honest submission needs more


class Ticker:
    """A thread of this (the trainer's) process ticking every 5 ms; the longest gap between
    two ticks is the longest time something else held the GIL (or the CPU)."""

    def __init__(self):
        self.longest_gap = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def _tick(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.005):
            now = time.monotonic()
            self.longest_gap = max(self.longest_gap, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=20.0)


@pytest.fixture(scope="module")
def big_task(tmp_path_factory):
    """A 400,000-row task: 300,000 test rows, so grading takes a good fraction of a second."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.normal(size=400_000)})
    df["label"] = np.where(df["a"] > 0, "yes", "no")
    return load_task(
        write_task(
            df,
            tmp_path_factory.mktemp("tasks") / "big",
            task_id="big",
            target="label",
            metric="accuracy",
            test_fraction=0.75,
            time_limit_s=30.0,
            memory_mb=1024,
        )
    )


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    with SandboxPool(
        num_workers=2,
        workroot=str(tmp_path_factory.mktemp("work")),
        disk_mb=64,
        grade_cpu_s=GRADE_CPU_S,
    ) as p:
        yield p


def writes_submission(id_cell: str = "", label_cell: str = "") -> str:
    """A script that submits the right ids labelled "yes", with its first row's id (or
    label) cell replaced by what the Python expression ``id_cell`` (``label_cell``) makes
    (built inside the sandbox: the script itself must stay small)."""
    return textwrap.dedent(
        f"""
        import os
        import pandas as pd
        te = pd.read_csv(os.path.join(os.environ["DATA_DIR"], "test.csv"), dtype=str)
        sub = pd.DataFrame({{"id": te["id"], "label": "yes"}})
        if {bool(id_cell)}:
            sub.loc[0, "id"] = {id_cell or "None"}
        if {bool(label_cell)}:
            sub.loc[0, "label"] = {label_cell or "None"}
        sub.to_csv(os.environ["SUBMISSION_PATH"], index=False)
        """
    )


@pytest.mark.parametrize(
    "column, expression, length",
    [
        ("id", '"1" * 30_000 + "a"', 30_001),  # the old number pattern: 30 s holding the GIL
        ("id", '"1" * 2**20 + "a"', 2**20 + 1),  # hours
        ("label", '"7" * 14 * 2**20', 14 * 2**20),  # once a detail string as long
    ],
    ids=["id-30k-digits", "id-1MB-digits", "label-14MB"],
)
def test_attack_cells_are_invalid_quickly_and_the_trainer_keeps_running(
    pool, task, column, expression, length
):
    script = writes_submission(**{f"{column}_cell": expression})
    with Ticker() as ticker:
        t0 = time.monotonic()
        r = pool.run(task, script)
        elapsed = time.monotonic() - t0
    assert ticker.longest_gap < 1.0, ticker.longest_gap
    assert elapsed < 15.0, elapsed
    assert r.status == Status.INVALID_SUBMISSION and r.reward == pytest.approx(0.2), r.detail
    assert r.detail == f"a cell of column {column!r} has {length:,} characters (at most 1,000)"


def test_a_grading_over_its_cpu_budget_is_invalid_and_never_stalls_the_trainer(
    pool, task, big_task
):
    """The bound itself: an honest 300,000-row submission needs more than the pool's 0.25 s
    grading budget, so it is INVALID_SUBMISSION saying so (never a reward, never UNGRADED),
    while a small task's submission in the same pool is graded exactly."""
    with Ticker() as ticker:
        r = pool.run(big_task, writes_submission())
    assert r.status == Status.INVALID_SUBMISSION, r
    assert r.detail == f"the submission could not be graded within {GRADE_CPU_S:g} s of CPU time"
    assert r.attempts == 1 and r.reward == pytest.approx(0.2)
    assert ticker.longest_gap < 1.0, ticker.longest_gap
    r = pool.run(task, GOOD_SCRIPT)
    assert r.status == Status.VALID and r.score == pytest.approx(good_script_score(task))


def test_the_default_budget_grades_the_same_submission(big_task, tmp_path):
    """Without the tight budget the 300,000-row submission is VALID, with the score computed
    here from the labels: the budget is what made it INVALID above."""
    labels = pd.read_csv(big_task.labels_path)
    expected = float(np.mean(labels["label"] == "yes"))
    with SandboxPool(num_workers=1, workroot=str(tmp_path), startup_check=False) as p:
        r = p.run(big_task, writes_submission())
    assert r.status == Status.VALID, r
    assert r.score == pytest.approx(expected)


def test_a_grader_crash_is_ungraded_not_a_reward(pool, task, tmp_path):
    """Labels gone after the task was loaded: the grader itself fails, which is not the
    script's doing: retried once, then UNGRADED (masked out), naming the failure."""
    broken_root = tmp_path / "broken"
    shutil.copytree(task.root, broken_root)
    broken = dataclasses.replace(task, root=broken_root)
    (broken_root / "private" / "test_labels.csv").unlink()
    r = pool.run(broken, GOOD_SCRIPT)
    assert r.status == Status.UNGRADED and np.isnan(r.reward), r
    assert r.attempts == 2 and "grader failed" in r.detail and "test_labels.csv" in r.detail


def test_a_grader_stalled_without_using_cpu_is_killed_and_ungraded(
    pool, task, tmp_path, monkeypatch
):
    """A grader blocked on a named pipe uses no CPU: its wall-clock timer ends it at the
    deadline, and a stall that is not the submission's doing is UNGRADED."""
    monkeypatch.setattr(pool_module, "GRADE_WALL_SLACK_S", 1.0)  # deadline 4 * 0.25 + 1 = 2 s
    stalled_root = tmp_path / "stalled"
    shutil.copytree(task.root, stalled_root)
    labels = stalled_root / "private" / "test_labels.csv"
    labels.unlink()
    os.mkfifo(labels, 0o600)
    stalled = dataclasses.replace(task, root=stalled_root)
    t0 = time.monotonic()
    try:
        r = pool.run(stalled, GOOD_SCRIPT)
    finally:  # a later test that reads every file under the temp dirs would block on it
        shutil.rmtree(stalled_root)
    assert r.status == Status.UNGRADED and r.attempts == 2, r
    expected = "InfrastructureError: supervisor exited with -14: its grading passed the 2 s"
    assert r.detail.startswith(expected), r.detail
    assert time.monotonic() - t0 < 30
    # Nothing of it is left: the pool still grades an honest script exactly.
    r = pool.run(task, GOOD_SCRIPT)
    assert r.status == Status.VALID and r.score == pytest.approx(good_script_score(task))


# -- the script size cap -------------------------------------------------------------------


def padded(script: str, size: int) -> bytes:
    """A valid script of exactly ``size`` bytes: ``script`` and a long comment."""
    head = script.encode() + b"\n#"
    return head + b"x" * (size - len(head))


@pytest.fixture(scope="module")
def small_disk_pool(tmp_path_factory):
    """The smallest work dir the pool accepts: 1 MB, four maximum-size scripts."""
    with SandboxPool(num_workers=1, workroot=str(tmp_path_factory.mktemp("w")), disk_mb=1) as p:
        yield p


def test_a_script_over_the_size_cap_is_malformed_before_the_sandbox(small_disk_pool, task):
    over = padded(GOOD_SCRIPT, MAX_SCRIPT_BYTES + 1)
    r = small_disk_pool.run(task, over)
    assert r.status == Status.MALFORMED and r.reward == 0.0, r
    assert r.detail == f"script is {MAX_SCRIPT_BYTES + 1:,} bytes, over the 262,144-byte limit"
    assert r.runtime_s == 0.0 and r.attempts == 1
    # The attack as found, at this pool's scale: a script larger than the work dir's tmpfs
    # (copying it in failed, was retried, then UNGRADED: a script could choose to be masked).
    r = small_disk_pool.run(task, padded(GOOD_SCRIPT, 2 * 2**20))
    assert r.status == Status.MALFORMED and r.attempts == 1, r
    # Just under the cap, in the smallest work dir: it runs, and is graded exactly.
    r = small_disk_pool.run(task, padded(GOOD_SCRIPT, MAX_SCRIPT_BYTES))
    assert r.status == Status.VALID, r
    assert r.score == pytest.approx(good_script_score(task))


def test_limits_the_sandbox_cannot_honour_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"^disk_mb=0: the work dir must hold"):
        SandboxPool(num_workers=1, workroot=str(tmp_path), disk_mb=0)
    with pytest.raises(ValueError, match=r"^grade_cpu_s=0: must be a positive, finite"):
        SandboxPool(num_workers=1, workroot=str(tmp_path), grade_cpu_s=0)
    with pytest.raises(ValueError, match="unknown sandbox limit"):
        SandboxPool(num_workers=1, workroot=str(tmp_path), grade_cpu_seconds=1)
    assert os.listdir(tmp_path) == []  # refused before anything was made


# -- rlimits as root: nothing the script can reach is written or read by root by name --------

PLANTER = """
import os
planted = []
for name in ("result.json.tmp", "result.json", "out", "script.py", "data", "work"):
    try:
        path = os.path.join("..", name)
        if os.path.lexists(path):
            os.rename(path, path + ".moved")
        os.symlink(TARGET, path)
        planted.append(name)
    except OSError as e:
        print("refused", name, e.errno)
print("planted", planted)
s = os.stat("..")
print("parent", s.st_uid, oct(s.st_mode & 0o777))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="the rlimits fallback drops to a slot uid as root")
def test_rlimits_script_cannot_make_root_write_through_its_symlinks(task, tmp_path):
    """The script once owned its work dir's parent, where the supervisor (root) then wrote
    result.json.tmp by name: a symlink planted there made root overwrite any host file
    with the result's JSON. The parent is now root's (0711): every plant is refused, the
    file is untouched, and the run is graded as what it is (no submission)."""
    from tests.support.sandbox_checks import rlimits_pool

    target = tmp_path / "host_file"
    target.write_text("original\n")
    p, usable = rlimits_pool(num_workers=1)
    with p:
        r = p.run(task, f"TARGET = {str(target)!r}\n" + PLANTER)
        if usable:
            honest = p.run(task, GOOD_SCRIPT)
            assert honest.status == Status.VALID, honest
    assert target.read_text() == "original\n"
    assert "planted []" in r.stdout_tail, r.stdout_tail
    assert r.stdout_tail.count("refused") == 6 and "parent 0 0o711" in r.stdout_tail
    assert r.status == Status.NO_SUBMISSION, r
