"""Multi-turn episodes (`wmrl.rl.multiturn`): K = 1 is the single-turn trainer bit for bit;
at K = 2 the loss never sees an observation token, the trajectory reward is the best turn's,
every mode runs end to end, and a SIGKILLed run resumes to the uninterrupted run's results."""

import json
import math

import jax
import numpy as np
import pytest

from tests.rl_fixtures import tiny_config
from wmrl.envs.autoresearch.grader import Status
from wmrl.rl.multiturn import best_of_turns, improved_fraction, reward_by_turn

TIMING = ("_s", "device")


def _clean(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith(TIMING)}


def _drive(trainer_cls, config, s, workdir, steps: int):
    """Evaluate, `steps` RL steps, evaluate: (metrics, pairs, evals, final state)."""
    from wmrl.envs.autoresearch.pool import SandboxPool

    workdir.mkdir(parents=True)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = trainer_cls(config, s.prepared, s.policy, s.wm, pool, workdir)
    metrics, pairs, evals = [], [], []
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        evals.append(trainer.evaluate(st))
        trainer.warmup(st)
        for _ in range(steps):
            st, m, p = trainer.run_step(st)
            metrics.append(m)
            pairs += p
        evals.append(trainer.evaluate(st))
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    return metrics, pairs, evals, st


def _arrays(st) -> list[np.ndarray]:
    trees = (st.policy, st.ref_params, st.wm, st.correction, st.replay)
    return [np.asarray(x) for x in jax.tree.leaves(trees)]


@pytest.mark.parametrize("mode", ["wmrl", "real"])
def test_one_turn_episodes_equal_the_single_turn_trainer(rl_shared, tmp_path, mode):
    """The episode trainer at K = 1 (synchronous anchors, as the single-turn trainer with
    `rl.anchor_lag = 0`) gives the single-turn trainer's metrics, pairs, evaluations and
    every array of the final state exactly: the episode logic reduces to single-turn."""
    from wmrl.rl.experiment import prepare_stages
    from wmrl.rl.multiturn import MultiTurnTrainer
    from wmrl.rl.trainer import Trainer

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode=mode, rl__anchor_lag=0)
    s = prepare_stages(config, tmp_path / "stages", progress=False)
    single = _drive(Trainer, config, s, tmp_path / "single", steps=2)
    episodes = _drive(MultiTurnTrainer, config, s, tmp_path / "episodes", steps=2)
    for a, b in zip(single[0], episodes[0], strict=True):  # metrics: every single-turn key
        a = _clean(a)
        assert a == {k: v for k, v in _clean(b).items() if k in a}
        assert b["anchor_reward_by_turn"] == [pytest.approx(a["train_reward"], abs=1)]
    assert len(single[1]) == len(episodes[1]) > 0
    for a, b in zip(single[1], episodes[1], strict=True):  # pairs
        assert a == {k: v for k, v in b.items() if k in a}
        assert b["best_turn"] == 1 and b["turn_r_env"] == [pytest.approx(a["r_env"])]
    for a, b in zip(single[2], episodes[2], strict=True):  # held-out evaluations
        a = _clean(a)
        assert a == {k: v for k, v in _clean(b).items() if k in a}
        assert b["heldout_reward_by_turn"] == [pytest.approx(a["heldout_reward"])]
    for x, y in zip(_arrays(single[3]), _arrays(episodes[3]), strict=True):
        np.testing.assert_array_equal(x, y)


def test_trajectory_reward_is_the_best_turn_and_by_turn_curves():
    V, R, U = int(Status.VALID), int(Status.RUNTIME_ERROR), int(Status.UNGRADED)
    reward = np.array([[0.1, 0.8, 0.6, 0.1], [0.7, 0.5, 0.2, 0.1]], np.float32)  # [K=2, N=4]
    status = np.array([[R, V, V, R], [V, V, V, U]], np.int32)
    r, s, best = best_of_turns(reward, status)
    np.testing.assert_array_equal(r, np.array([0.7, 0.8, 0.6, 0.0], np.float32))
    np.testing.assert_array_equal(s, [V, V, V, U])  # an UNGRADED turn: the episode is
    np.testing.assert_array_equal(best[:3], [1, 0, 0])
    graded = s != U
    assert reward_by_turn(reward, graded) == pytest.approx([0.5, (0.7 + 0.8 + 0.6) / 3])
    assert improved_fraction(reward, graded) == pytest.approx(1 / 3)
    assert reward_by_turn(reward, np.zeros(4, bool)) == [None, None]
    assert math.isnan(float("nan"))  # (the helpers never return NaN for an empty set)
    assert improved_fraction(reward, np.zeros(4, bool)) is None


def read_jsonl(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
