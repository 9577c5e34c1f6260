"""The anchor queue over a scripted executor, in-process: what each step trains on with and
without the lag, journal reuse, draining, and resubmission after a restart lost the futures.
Every expected reward is the scripted one (`FakeExecutor`), so a row trained on the wrong
step's or the wrong script's outcome fails here."""

import math
import types

import numpy as np
import pytest

from wmrl.autoresearch.anchors import AnchorJournal, AnchorQueue
from wmrl.autoresearch.env.fake_executor import FakeExecutor, Outcome, hashed_outcome, sha
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.result import InfrastructureError
from wmrl.autoresearch.state import Pending

TASK = types.SimpleNamespace(id="task-a")


def scripts_of(step: int, n: int = 3) -> list[str]:
    return [f"# step {step} row {k}\nprint({step * 10 + k})" for k in range(n)]


def scripted(steps: int = 4, n: int = 3) -> dict:
    """Step s, row k: VALID with reward 0.5 + (10 s + k) / 100, except row 2 of every step,
    a runtime error (0.1)."""
    out = {}
    for s in range(steps):
        for k, text in enumerate(scripts_of(s, n)):
            out[sha(text)] = (
                Outcome(Status.RUNTIME_ERROR, error_type="KeyError")
                if k == 2
                else Outcome(Status.VALID, 0.5 + (10 * s + k) / 100)
            )
    return out


def expected(step: int) -> np.ndarray:
    return np.asarray([0.5 + 10 * step / 100, 0.5 + (10 * step + 1) / 100, 0.1], np.float32)


def pending_of(step: int, rows) -> Pending:
    p = Pending.empty(len(rows), 4)
    return p.replace(step=np.int64(step), rows=np.asarray(rows, np.int64))


def describe(pending):
    return [TASK] * len(pending.rows), scripts_of(int(pending.step))


def test_lag_0_trains_each_step_on_its_own_outcomes(tmp_path):
    fake = FakeExecutor(scripted(), workers=2, latency_s=0.01)
    q = AnchorQueue(AnchorJournal(tmp_path / "anchors.jsonl"), fake, lag=0)
    for step in range(3):
        sub = q.submit(step, np.array([4, 5, 6]), [TASK] * 3, scripts_of(step))
        out = q.exchange(sub, pending_of(-1, [0, 0, 0]), describe)
        assert out.step == step
        np.testing.assert_allclose(out.r_env, expected(step), rtol=0, atol=1e-7)
        assert out.status.tolist() == [Status.VALID, Status.VALID, Status.RUNTIME_ERROR]
        assert out.error_type[2] >= 0 and out.new == 3
    assert [c.key for c in fake.calls[:3]] == ["anchor/0/4", "anchor/0/5", "anchor/0/6"]
    fake.close()


def test_lag_1_trains_on_the_previous_steps_outcomes_while_its_own_execute(tmp_path):
    # Slow executions: step s's anchors are still running when step s + 1 submits its own.
    fake = FakeExecutor(scripted(), workers=3, latency_s=0.05)
    q = AnchorQueue(AnchorJournal(tmp_path / "anchors.jsonl"), fake, lag=1)
    rows = np.array([0, 1, 2])
    sub0 = q.submit(0, rows, [TASK] * 3, scripts_of(0))
    assert q.exchange(sub0, pending_of(-1, rows), describe) is None  # nothing pending yet
    assert fake.free_slots() < 3  # step 0's executions are in flight
    sub1 = q.submit(1, rows, [TASK] * 3, scripts_of(1))
    out = q.exchange(sub1, pending_of(0, rows), describe)
    assert out.step == 0  # step 1 trains on step 0's anchors
    np.testing.assert_allclose(out.r_env, expected(0), atol=1e-7)
    # Draining before untimed work waits for step 1's and journals them.
    waited = q.drain(pending_of(1, rows))
    assert waited >= 0.0 and fake.free_slots() == 3
    journal = AnchorJournal(tmp_path / "anchors.jsonl")
    assert {(1, r) for r in range(3)} <= set(journal.done)
    assert journal.lookup(1, 1, scripts_of(1)[1])["reward"] == pytest.approx(0.61)
    # The drained executions count as new once, when their step is collected.
    sub2 = q.submit(2, rows, [TASK] * 3, scripts_of(2))
    out = q.exchange(sub2, pending_of(1, rows), describe)
    np.testing.assert_allclose(out.r_env, expected(1), atol=1e-7)
    assert out.new == 3
    fake.close()


def test_a_restart_resubmits_the_pending_rows_and_reuses_the_journal(tmp_path):
    path = tmp_path / "anchors.jsonl"
    fake = FakeExecutor(scripted(), workers=2)
    q = AnchorQueue(AnchorJournal(path), fake, lag=1)
    rows = np.array([3, 7, 9])
    q.exchange(q.submit(0, rows, [TASK] * 3, scripts_of(0)), pending_of(-1, rows), describe)
    q.drain(pending_of(0, rows))  # step 0's outcomes journalled, then the process dies
    q.journal.close()
    q.forget()
    calls_before = len(fake.calls)

    # The resumed process: a fresh queue over the same journal; step 0's futures are gone.
    fake2 = FakeExecutor(scripted(), workers=2)
    q2 = AnchorQueue(AnchorJournal(path), fake2, lag=1)
    sub1 = q2.submit(1, rows, [TASK] * 3, scripts_of(1))
    out = q2.exchange(sub1, pending_of(0, rows), describe)
    np.testing.assert_allclose(out.r_env, expected(0), atol=1e-7)
    assert out.new == 0  # every pending row came from the journal: nothing paid twice
    assert [c.key for c in fake2.calls] == ["anchor/1/3", "anchor/1/7", "anchor/1/9"]
    assert calls_before == 3
    # Without the journal records the pending rows are executed again, under the same keys.
    q2.forget()
    fake3 = FakeExecutor(scripted(), workers=2)
    q3 = AnchorQueue(AnchorJournal(tmp_path / "fresh.jsonl"), fake3, lag=1)
    sub2 = q3.submit(2, rows, [TASK] * 3, scripts_of(2))
    out = q3.exchange(sub2, pending_of(1, rows), describe)
    np.testing.assert_allclose(out.r_env, expected(1), atol=1e-7)
    assert out.new == 3
    assert [c.key for c in fake3.calls][3:] == ["anchor/1/3", "anchor/1/7", "anchor/1/9"]
    for f in (fake, fake2, fake3):
        f.close()


def test_a_changed_script_is_not_served_from_the_journal(tmp_path):
    fake = FakeExecutor(scripted(), workers=1)
    q = AnchorQueue(AnchorJournal(tmp_path / "anchors.jsonl"), fake, lag=0)
    q.exchange(q.submit(0, np.array([0]), [TASK], scripts_of(0)[:1]), pending_of(-1, [0]),
               describe)  # fmt: skip
    other = scripts_of(1)[:1]  # same (step, row), a different script: executed, not reused
    out = q.exchange(q.submit(0, np.array([0]), [TASK], other), pending_of(-1, [0]), describe)
    assert out.new == 1 and out.r_env[0] == pytest.approx(0.6)
    fake.close()


def test_ungraded_rows_stay_masked_and_infrastructure_errors_surface(tmp_path):
    texts = ["a = 1", "b = 2"]
    fake = FakeExecutor({sha(texts[0]): Outcome(Status.UNGRADED),
                         sha(texts[1]): Outcome(Status.VALID, 0.9)})  # fmt: skip
    q = AnchorQueue(AnchorJournal(tmp_path / "anchors.jsonl"), fake, lag=0)
    out = q.exchange(q.submit(0, np.array([0, 1]), [TASK] * 2, texts), pending_of(-1, [0, 1]),
                     describe)  # fmt: skip
    assert out.status.tolist() == [Status.UNGRADED, Status.VALID]
    assert out.r_env.tolist() == [0.0, pytest.approx(0.9)]  # 0 where ungraded, and masked
    broken = FakeExecutor({sha("c = 3"): Outcome(Status.VALID, 0.7, error="sandbox died")})
    q = AnchorQueue(AnchorJournal(tmp_path / "b.jsonl"), broken, lag=0)
    with pytest.raises(InfrastructureError, match="sandbox died"):
        q.exchange(q.submit(0, np.array([0]), [TASK], ["c = 3"]), pending_of(-1, [0]), describe)
    fake.close()
    broken.close()


def test_fake_executor_refuses_unscripted_scripts_and_bad_outcomes():
    fake = FakeExecutor({})
    with pytest.raises(KeyError, match="no outcome scripted"):
        fake.submit(TASK, "print(2)")
    with pytest.raises(ValueError, match=r"VALID outcome needs its reward in \[0.5, 1\]"):
        Outcome(Status.VALID, 0.3)
    fake.close()
    res = FakeExecutor(default=hashed_outcome).run(TASK, "x = 1")
    assert res.isolation == "fake" and (res.status != Status.VALID or res.reward >= 0.5)
    assert math.isnan(FakeExecutor({sha("u"): Outcome(Status.UNGRADED)}).run(TASK, "u").reward)


def test_fake_executor_completes_by_latency_not_by_submission_order():
    slow, fast = "slow = 1", "fast = 1"
    outcomes = {
        sha(slow): Outcome(Status.VALID, 0.6, latency_s=0.2),
        sha(fast): Outcome(Status.VALID, 0.8, latency_s=0.0),
    }
    fake = FakeExecutor(outcomes, workers=2)
    futures = fake.submit_batch([(TASK, slow), (TASK, fast)])
    order = [f.result().reward for f in fake.as_completed(futures)]
    assert order == [pytest.approx(0.8), pytest.approx(0.6)]
    fake.close()
