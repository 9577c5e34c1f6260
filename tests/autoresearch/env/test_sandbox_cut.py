"""A cap below the time limit (`SandboxPool.submit(..., cut_s=)`, cost-aware routing), run for
real: a script still running at the cap is stopped there, its slot is free for the next job
at once, nothing of it is graded, and it is reported cut with the seconds it ran, never as
a TIMEOUT. A script that finishes under the cap is graded exactly as without one."""

from __future__ import annotations

import math
import os
import time

import pytest

from tests.support.autoresearch_fixtures import GOOD_SCRIPT, good_script_score, make_tiny_task
from tests.support.sandbox_checks import assert_no_sandbox_pids
from wmrl.autoresearch.env import forkserver
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.pool import SandboxPool

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not os.sys.platform.startswith("linux"), reason="Linux sandbox"),
]

# A VALID submission, then a long sleep: graded, it would be VALID; past its limit, TIMEOUT.
SLOW_VALID = GOOD_SCRIPT + "\nimport time\ntime.sleep(60)\n"


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return make_tiny_task(tmp_path_factory.mktemp("tasks") / "tiny", time_limit_s=20.0)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """One slot: a second job can start only once the first has freed it."""
    with SandboxPool(num_workers=1, workroot=str(tmp_path_factory.mktemp("work"))) as p:
        yield p


def test_a_cut_frees_the_slot_at_the_cap_and_is_never_graded(pool, task):
    cap = 1.5
    t0 = time.monotonic()
    slow = pool.submit(task, SLOW_VALID, key="cut/slow", cut_s=cap)
    honest = pool.submit(task, GOOD_SCRIPT, key="cut/honest")  # queued behind it
    r = slow.result()
    cut_at = time.monotonic() - t0
    assert r.cut and r.status == Status.UNGRADED and math.isnan(r.reward)
    assert r.score is None and r.percentile is None and r.validation is None  # not graded
    assert cap <= r.runtime_s < cap + 1.0  # the seconds it ran: the cap, not its 20 s limit
    assert cut_at < cap + 5.0
    assert "cut" in r.detail
    assert_no_sandbox_pids(pool)  # the stopped script left nothing behind
    # The slot went to the queued job at the cap: it finished long before the slow script's
    # 20 s limit, graded exactly.
    h = honest.result()
    assert time.monotonic() - t0 < cap + 12.0
    assert h.status == Status.VALID and not h.cut
    assert h.score == pytest.approx(good_script_score(task), abs=1e-12)
    assert pool.free_slots() == 1


def test_under_the_cap_the_script_is_graded_as_without_one(pool, task):
    r = pool.submit(task, GOOD_SCRIPT, key="cut/under", cut_s=15.0).result()
    assert r.status == Status.VALID and not r.cut
    assert r.score == pytest.approx(good_script_score(task), abs=1e-12)


def test_a_cap_at_or_above_the_limit_changes_nothing(tmp_path):
    short = make_tiny_task(tmp_path / "short", time_limit_s=2.0)
    (tmp_path / "work").mkdir()
    with SandboxPool(num_workers=1, workroot=str(tmp_path / "work")) as p:
        r = p.submit(short, SLOW_VALID, key="cut/over", cut_s=5.0).result()
    assert r.status == Status.TIMEOUT and not r.cut and r.reward == pytest.approx(0.1)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_bad_caps_are_refused(pool, task, bad):
    with pytest.raises(ValueError, match="cut_s"):
        pool.submit(task, GOOD_SCRIPT, cut_s=bad)


def test_the_supervisor_never_grades_a_cut():
    clean = {"exit_code": 0, "signal": None, "timed_out": False, "submission": "ok"}
    assert forkserver._submission_decides(clean)
    assert not forkserver._submission_decides({**clean, "cut": True})
