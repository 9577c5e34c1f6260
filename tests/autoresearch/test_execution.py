"""The one journalled execute-and-merge (`wmrl.autoresearch.execution`) with a stand-in pool
and a real journal file: journal hits are not executed again, every new outcome is journalled
as it completes, the seed keys name the row, and the merged arrays are the records' numbers."""

import math
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np

from wmrl.autoresearch import execution
from wmrl.autoresearch.anchors import AnchorJournal, AnchorQueue
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import ERROR_TYPES


class RecordingPool:
    """Completes every submission at once with the outcome `outcome(task, script)`, and
    remembers what was submitted (task id, script, seed key)."""

    def __init__(self, outcome):
        self.outcome, self.submitted = outcome, []

    def submit(self, task, script, key):
        self.submitted.append((task.id, script, key))
        fut = Future()
        fut.set_result(self.outcome(task, script))
        return fut


def result(status, reward, runtime_s=1.0, error_type="none", validation=None):
    return SimpleNamespace(status=status, reward=reward, runtime_s=runtime_s,
                           error_type=error_type, validation=validation)  # fmt: skip


TASKS = [SimpleNamespace(id=f"t{i}") for i in range(4)]
OUTCOMES = {
    "ok": result(Status.VALID, 0.75, runtime_s=2.5, validation=0.8125),
    "crash": result(Status.RUNTIME_ERROR, 0.1, runtime_s=0.5, error_type="ValueError"),
    "lost": result(Status.UNGRADED, math.nan, runtime_s=math.nan),
    "slow": result(Status.TIMEOUT, 0.1, runtime_s=10.0),
}


def test_execute_reuses_journal_hits_and_merges_the_records(tmp_path):
    journal = AnchorJournal(tmp_path / "anchors.jsonl")
    journal.record(3, 11, "slow", "t3", Status.TIMEOUT, 0.1, runtime_s=10.0)  # done before
    pool = RecordingPool(lambda task, script: OUTCOMES[script])
    scripts = ["ok", "crash", "lost", "slow"]
    out, new = execution.execute(journal, pool, 3, [8, 9, 10, 11], TASKS, scripts, "eval")
    # the journalled row is not executed again; the seed keys are kind/step/row
    assert pool.submitted == [("t0", "ok", "eval/3/8"), ("t1", "crash", "eval/3/9"),
                              ("t2", "lost", "eval/3/10")]  # fmt: skip
    assert new == 3
    np.testing.assert_array_equal(out["status"], [Status.VALID, Status.RUNTIME_ERROR,
                                                  Status.UNGRADED, Status.TIMEOUT])  # fmt: skip
    np.testing.assert_array_equal(out["reward"], [0.75, 0.1, np.nan, 0.1])
    np.testing.assert_array_equal(out["runtime_s"], [2.5, 0.5, np.nan, 10.0])
    none, value_error = ERROR_TYPES.index("none"), ERROR_TYPES.index("ValueError")
    # the row journalled before without an error type: unknown (-1)
    np.testing.assert_array_equal(out["error_type"], [none, value_error, none, -1])
    np.testing.assert_array_equal(out["validation"], [0.8125, np.nan, np.nan, np.nan])
    assert out["reward"].dtype == np.float64 and out["status"].dtype == np.int32
    journal.close()
    # every new outcome is in the file: a second pass executes nothing
    again = AnchorJournal(tmp_path / "anchors.jsonl")
    assert again.lookup(3, 9, "crash")["error_type"] == "ValueError"
    assert again.lookup(3, 10, "lost")["reward"] is None
    pool2 = RecordingPool(lambda task, script: OUTCOMES[script])
    out2, new2 = execution.execute(again, pool2, 3, [8, 9, 10, 11], TASKS, scripts, "eval")
    assert pool2.submitted == [] and new2 == 0
    for k in out:
        np.testing.assert_array_equal(out2[k], out[k])
    again.close()


def test_sandbox_task_and_journalled_fields_are_the_callers(tmp_path):
    """Multi-turn runs a suite task's episode task but journals the suite task's id, and
    keeps only the fields it passes."""
    journal = AnchorJournal(tmp_path / "anchors.jsonl")
    pool = RecordingPool(lambda task, script: OUTCOMES["crash"])
    episode = {t.id: SimpleNamespace(id=f"{t.id}-episode") for t in TASKS}
    ex = execution.submit(journal, pool, 0, [5], TASKS[:1], ["crash"], "anchor",
                          sandbox_task=lambda t: episode[t.id])  # fmt: skip
    out, new = execution.collect(journal, ex, fields=lambda res: {"runtime_s": res.runtime_s})
    assert pool.submitted == [("t0-episode", "crash", "anchor/0/5")] and new == 1
    rec = journal.lookup(0, 5, "crash")
    assert rec["task_id"] == "t0" and rec["runtime_s"] == 0.5 and "error_type" not in rec
    assert out["error_type"][0] == -1  # not journalled: unknown
    journal.close()


def test_anchor_queue_outcomes_are_float32_with_zero_reward_where_ungraded(tmp_path):
    journal = AnchorJournal(tmp_path / "anchors.jsonl")
    pool = RecordingPool(lambda task, script: OUTCOMES[script])
    queue = AnchorQueue(journal, pool, lag=0)
    sub = queue.submit(2, np.array([0, 3]), TASKS[:2], ["ok", "lost"])
    got = queue.collect(sub)
    assert [k for _, _, k in pool.submitted] == ["anchor/2/0", "anchor/2/3"]
    np.testing.assert_array_equal(got.r_env, np.array([0.75, 0.0], np.float32))
    np.testing.assert_array_equal(got.status, [Status.VALID, Status.UNGRADED])
    np.testing.assert_array_equal(got.runtime_s, np.array([2.5, np.nan], np.float32))
    np.testing.assert_array_equal(got.validation, np.array([0.8125, np.nan], np.float32))
    assert got.r_env.dtype == np.float32 and got.new == 2
    journal.close()
