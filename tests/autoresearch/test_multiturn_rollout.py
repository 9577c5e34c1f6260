"""The multi-turn rollout in-process, over a scripted executor: each turn of an anchor episode
is executed on the task's episode task, journalled under its own key, and its real
observation is what the next turn is written from; the episode's reward is its best turn's;
a redone step takes every turn from the journal. The policy is replaced by a rule that
writes turn t + 1 from the observation of turn t, so every expected value follows by hand
from the scripted outcomes."""

import types

import numpy as np
import pytest

from wmrl.autoresearch.anchors import AnchorJournal
from wmrl.autoresearch.env.fake_executor import FakeExecutor, Outcome
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.multiturn import MultiTurnTrainer, best_of_turns, reward_by_turn
from wmrl.autoresearch.step import Routed, Sampled
from wmrl.core.correct import MODE_SPECS
from wmrl.experiment.step import PhaseClock

TASKS = [types.SimpleNamespace(id="task-a"), types.SimpleNamespace(id="task-b")]
EPISODE_TASKS = {t.id: types.SimpleNamespace(id=t.id + "/episode") for t in TASKS}
G = 2  # episodes per task: N = 4 episodes, rows task-a, task-a, task-b, task-b


def first_scripts() -> list[str]:
    return [f"# {t.id} sample {g}\nfit()" for t in TASKS for g in range(G)]


def revise(script: str, obs) -> str:
    """The stand-in policy: the next turn names what the last observation said."""
    return f"{script}\n# after {Status(obs.status).name} {obs.error_type}"


def outcome(task, script) -> Outcome:
    """Turn 1 of sample 0 fails with a KeyError, its fix (turn 2) is VALID 0.8 and turn 3
    VALID 0.7; sample 1 is VALID 0.6 from the start and each revision adds 0.05. The
    outcome must be asked on the episode task, never the suite task."""
    assert task.id.endswith("/episode")
    turn = script.count("# after") + 1
    if "sample 0" in script:
        return {
            1: Outcome(Status.RUNTIME_ERROR, error_type="KeyError", runtime_s=0.5),
            2: Outcome(Status.VALID, 0.8, runtime_s=1.5, validation=0.9),
            3: Outcome(Status.VALID, 0.7, runtime_s=1.25, validation=0.85),
        }[turn]
    return Outcome(Status.VALID, 0.6 + 0.05 * (turn - 1), runtime_s=1.0, validation=0.5)


def make_trainer(pool, journal, K=3):
    """A MultiTurnTrainer with only what the rollout reads: no model is built."""
    tr = object.__new__(MultiTurnTrainer)
    tr.K, tr.G, tr.sc = K, G, None
    tr.pool, tr.journal, tr.episode_tasks = pool, journal, EPISODE_TASKS
    tr.spec = MODE_SPECS["real"]  # every row executed; no WM observation

    def turn(params, t, tasks, row_tasks, past, sc, key):
        scripts = [revise(p[-1][0], p[-1][1]) for p in past]
        return {"tokens": np.zeros((len(scripts), 1), np.int32)}, scripts

    tr._turn = turn
    return tr


def rollout(tr, step=0):
    n = len(TASKS) * G
    row_tasks = [t for t in TASKS for _ in range(G)]
    sampled = Sampled(step, row_tasks, {"tokens": np.zeros((n, 1), np.int32)}, first_scripts())
    every = np.arange(n)
    routed = Routed(
        np.ones(2, bool), np.zeros(2, np.int32), np.ones(n, bool), every, None, every, 1.0
    )
    st = types.SimpleNamespace(step=step, policy=types.SimpleNamespace(params=None))
    return tr.rollout(st, sampled, routed, key=None, clock=PhaseClock())


def test_each_turn_is_written_from_the_real_observation_of_the_last(tmp_path):
    fake = FakeExecutor(default=outcome, workers=2, latency_s=0.005)
    ep = rollout(make_trainer(fake, AnchorJournal(tmp_path / "anchors.jsonl")))
    # Turn 2 of sample 0 was written after turn 1's real KeyError, turn 3 after VALID.
    assert ep.scripts[1][0].endswith("# after RUNTIME_ERROR KeyError")
    assert ep.scripts[2][0].endswith("# after VALID none")
    np.testing.assert_array_equal(
        ep.status,
        [[Status.RUNTIME_ERROR, Status.VALID] * 2, [Status.VALID] * 4, [Status.VALID] * 4],
    )
    np.testing.assert_allclose(
        ep.reward, [[0.1, 0.6, 0.1, 0.6], [0.8, 0.65, 0.8, 0.65], [0.7, 0.7, 0.7, 0.7]],
        atol=1e-6,
    )  # fmt: skip
    assert ep.observations[0][0].error_type == "KeyError"
    assert ep.new_executions == 12  # 3 turns x 4 episodes, each executed once
    # Each turn journalled under its own key (turn t, row i: t * N + i) on the episode task.
    keys = sorted(c.key for c in fake.calls)
    assert keys == sorted(f"anchor/0/{t * 4 + i}" for t in range(3) for i in range(4))
    assert {c.task_id for c in fake.calls} == {"task-a/episode", "task-b/episode"}
    # The episode's reward is its best turn's: 0.8 (turn 2) and 0.7 (turn 3).
    r, s, best = best_of_turns(ep.reward, ep.status)
    np.testing.assert_allclose(r, [0.8, 0.7, 0.8, 0.7], atol=1e-6)
    assert best.tolist() == [1, 2, 1, 2]
    graded = s != Status.UNGRADED
    assert reward_by_turn(ep.reward, graded) == pytest.approx([0.35, 0.725, 0.75])
    fake.close()


def test_a_redone_step_takes_every_turn_from_the_journal(tmp_path):
    path = tmp_path / "anchors.jsonl"
    first = FakeExecutor(default=outcome, workers=2)
    ep = rollout(make_trainer(first, AnchorJournal(path)))
    first.close()
    again = FakeExecutor({}, workers=2)  # nothing scripted: any execution would raise
    tr = make_trainer(again, AnchorJournal(path))
    redone = rollout(tr)
    assert redone.new_executions == 0 and again.calls == []
    np.testing.assert_array_equal(redone.status, ep.status)
    np.testing.assert_allclose(redone.reward, ep.reward)
    # The journal kept each observation's fields, so the later turns are written the same.
    assert redone.scripts == ep.scripts
    again.close()
