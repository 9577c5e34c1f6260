"""Multi-turn episodes (`wmrl.autoresearch.multiturn`): K = 1 is the single-turn trainer bit
for bit;
at K = 2 the loss never sees an observation token, the trajectory reward is the best turn's,
every mode runs end to end, and a SIGKILLed run resumes to the uninterrupted run's results."""

import json
import math

import jax
import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.multiturn import best_of_turns, improved_fraction, reward_by_turn
from wmrl.autoresearch.presets import TINY_MULTITURN_SETTING

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

TIMING = ("_s", "device")


def _clean(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.endswith(TIMING)}


def _drive(trainer_cls, config, s, workdir, steps: int, rule_calls: list | None = None):
    """Evaluate, `steps` RL steps, evaluate: (metrics, pairs, evals, final state). With
    `rule_calls`, every update of the adaptive anchor fraction's state is appended to it."""
    from wmrl.autoresearch.env.pool import SandboxPool

    workdir.mkdir(parents=True)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = trainer_cls(config, s.prepared, s.policy, s.wm, pool, workdir)
    metrics, pairs, evals = [], [], []
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        evals.append(trainer.evaluate(st))
        trainer.warmup(st)
        if rule_calls is not None:  # from here on: the steps' updates
            update = trainer._rho_update
            trainer._rho_update = lambda *a: rule_calls.append(a) or update(*a)
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


# `real` (no WM stream) is the simpler reduction; the fast suite keeps `wmrl`, and `wmrl` with
# the fidelity-driven anchor fraction (its rule must be applied by the episode trainer too).
@pytest.mark.parametrize(
    "mode,adaptive",
    [("wmrl", False), ("wmrl", True), pytest.param("real", False, marks=pytest.mark.slow)],
)
def test_one_turn_episodes_equal_the_single_turn_trainer(rl_shared, tmp_path, mode, adaptive):
    """The episode trainer at K = 1 (synchronous anchors, as the single-turn trainer with
    `rl.anchor_lag = 0`) gives the single-turn trainer's metrics, pairs, evaluations and
    every array of the final state exactly: the episode logic reduces to single-turn. With
    `correction.adaptive_rho` the rule's state and the rho in force are the same too."""
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.multiturn import MultiTurnTrainer
    from wmrl.autoresearch.trainer import Trainer

    data_dir, init_dir = rl_shared
    config = tiny_config(
        data_dir, init_dir, mode=mode, rl__anchor_lag=0, correction__adaptive_rho=adaptive
    )
    s = prepare_stages(config, tmp_path / "stages", progress=False)
    calls = {"single": [], "episodes": []} if adaptive else {"single": None, "episodes": None}
    single = _drive(Trainer, config, s, tmp_path / "single", 2, calls["single"])
    episodes = _drive(MultiTurnTrainer, config, s, tmp_path / "episodes", 2, calls["episodes"])
    for a, b in zip(single[0], episodes[0], strict=True):  # metrics: every single-turn key
        a = _clean(a)
        assert a == {k: v for k, v in _clean(b).items() if k in a}
        assert b["anchor_reward_by_turn"] == [pytest.approx(a["train_reward"], abs=1)]
    assert len(single[1]) == len(episodes[1]) > 0
    for a, b in zip(single[1], episodes[1], strict=True):  # pairs
        # A single script's P(timeout) has no episode counterpart (the reward is the best
        # turn's): episode pairs leave it out, and the timeout calibration skips them.
        # Its one turn carries it instead (`turn_p_timeout`), with the static check's verdict.
        if "p_timeout" in a:
            assert b["turn_p_timeout"] == [pytest.approx(a["p_timeout"])]
        a = {k: v for k, v in a.items() if k != "p_timeout"}
        assert a == {k: v for k, v in b.items() if k in a}
        assert b["best_turn"] == 1 and b["turn_r_env"] == [pytest.approx(a["r_env"])]
        assert b["turn_static"] == [a["static"]]
    for a, b in zip(single[2], episodes[2], strict=True):  # held-out evaluations
        a = _clean(a)
        assert a == {k: v for k, v in _clean(b).items() if k in a}
        assert b["heldout_reward_by_turn"] == [pytest.approx(a["heldout_reward"])]
    for x, y in zip(_arrays(single[3]), _arrays(episodes[3]), strict=True):
        np.testing.assert_array_equal(x, y)
    if adaptive:  # the rule measured the anchor groups of both steps, in both trainers
        assert len(calls["single"]) == len(calls["episodes"]) == 2
        rule_single, rule_episodes = single[3].adaptive_rho, episodes[3].adaptive_rho
        for x, y in zip(jax.tree.leaves(rule_single), jax.tree.leaves(rule_episodes), strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


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


# -- K = 2 -------------------------------------------------------------------------------

MULTITURN = {k.replace(".", "__"): v for k, v in TINY_MULTITURN_SETTING.items()}


@pytest.fixture(scope="module")
def mt_shared(rl_shared, tmp_path_factory):
    """The tiny setting's data stage (shared with the single-turn tests: the suite and the
    corpus) and the K = 2 stages of this module (warm start and WM pretraining)."""
    data_dir, _ = rl_shared
    return data_dir, tmp_path_factory.mktemp("mt_init")


def mt_config(mt_shared, **changes):
    data_dir, init_dir = mt_shared
    return tiny_config(data_dir, init_dir, **{**MULTITURN, **changes})


ABLATION_MODES = ("real", "wm_only", "debias_only", "denoise_only", "static_anchors")


# The fast suite runs `wmrl` (WM-written observations, anchor episodes executed every turn,
# both corrections); `real` and the other WM modes (the correction's switches) are slow.
@pytest.mark.parametrize(
    "mode",
    [
        "wmrl",
        *(pytest.param(m, marks=pytest.mark.slow) for m in (*ABLATION_MODES, "permuted_wm")),
    ],
)
def test_every_mode_runs_two_turn_episodes_end_to_end(mt_shared, tmp_path, mode):
    from wmrl.autoresearch.experiment import run

    config = mt_config(mt_shared, mode=mode)
    summary = run(config, tmp_path, progress=False)
    steps = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "step"]
    evals = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in steps] == [1, 2] and len(evals) == 2
    anchor_groups = 2 if mode == "real" else 1  # of 2; rho = 0.25 rounds to min_groups = 1
    for r in steps:  # every turn of every anchor episode executed: K * G per anchor group
        assert r["turns"] == 2
        assert r["real_executions_step"] == 2 * 2 * anchor_groups
        assert len(r["anchor_reward_by_turn"]) == 2
        assert r["anchor_reward_by_turn"][1] >= r["anchor_reward_by_turn"][0]  # best of 2
    for e in evals:
        by_turn = e["heldout_reward_by_turn"]
        assert len(by_turn) == 2 and by_turn[1] >= by_turn[0]
        assert e["heldout_reward"] == pytest.approx(by_turn[-1])  # best of K
        assert 0.0 <= e["heldout_improved_fraction"] <= 1.0
    assert summary["warmstart_heldout_reward_by_turn"] == evals[0]["heldout_reward_by_turn"]
    assert summary["final_heldout_reward_by_turn"] == evals[-1]["heldout_reward_by_turn"]
    pairs = read_jsonl(tmp_path / "pairs.jsonl")
    assert pairs and all(len(p["turn_r_env"]) == 2 for p in pairs)
    for p in pairs:  # the trajectory's real reward is its best turn's
        assert p["r_env"] == pytest.approx(max(p["turn_r_env"]))
    # The WM's P(timeout) per turn (a trajectory has none), calibrated over the learned turns.
    calibration = (summary.get("anchor_figures") or {}).get("all", {}).get("timeout_calibration")
    if mode == "real":
        assert not any("turn_p_timeout" in p for p in pairs)
    else:
        assert all(len(p["turn_p_timeout"]) == 2 for p in pairs)
        assert all(0.0 <= v <= 1.0 for p in pairs for v in p["turn_p_timeout"])
        learned = [
            s for p in pairs for s, fixed in zip(p["turn_status"], p["turn_static"], strict=True)
            if not fixed and s != int(Status.UNGRADED)
        ]  # fmt: skip
        if learned:
            assert calibration["rows"] == len(learned)
            assert calibration["timeouts"] == sum(s == int(Status.TIMEOUT) for s in learned)
    journal = read_jsonl(tmp_path / "anchors.jsonl")
    assert len(journal) == summary["real_executions"]
    assert all("runtime_s" in j for j in journal if j["status"] != int(Status.UNGRADED))


def test_observation_tokens_carry_no_loss(mt_shared, tmp_path):
    """Every training row's loss mask is zero on its prompt (the card, the earlier script and
    the observation of turn 1) and one on the agent's own script tokens; the policy loss's
    gradient with respect to the per-token log-probs is exactly zero on every observation
    token and not on the script tokens."""
    import jax.numpy as jnp

    from wmrl.autoresearch.env.observation import render_observation
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.multiturn import MultiTurnTrainer
    from wmrl.core.grpo import token_policy_loss

    config = mt_config(mt_shared, mode="wmrl")
    s = prepare_stages(config, tmp_path, progress=False)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = MultiTurnTrainer(config, s.prepared, s.policy, s.wm, pool, tmp_path)
    batches = []
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        trainer.warmup(st)
        step = trainer._policy_step
        trainer._policy_step = lambda state, batch: (batches.append(batch), step(state, batch))[1]
        from wmrl.experiment.step import PhaseClock

        keys, clock = trainer.keys(st), PhaseClock()  # the step's own phases, replayed
        first = trainer.sample(st, keys.sample, clock)
        ep = trainer.rollout(
            st, first, trainer.route(st, first, keys.route, clock), keys.sample, clock
        )
        st, _, _ = trainer.run_step(st)
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    (batch,) = batches
    P, N = config.data.max_prompt_len, len(ep.scripts[0])
    assert batch["tokens"].shape[0] == 2 * N  # one row per turn of every episode
    loss_mask = batch["loss_mask"]
    assert not loss_mask[:, :P].any()  # the prompts: no loss
    np.testing.assert_array_equal(loss_mask[:, P:], batch["input_mask"][:, P:])
    tok = trainer.tok
    for i in range(N):  # turn 2's prompt holds turn 1's observation, in the masked columns
        row = batch["tokens"][N + i]
        prompt = tok.decode(row[:P][batch["input_mask"][N + i, :P]])
        task = trainer.episode_tasks[first.row_tasks[i].id]
        obs_text = render_observation(ep.observations[0][i], task.metric_name)
        assert f"### TURN 1 RESULT\n{obs_text}" in prompt, prompt[-300:]
    grad = jax.grad(
        lambda lp: token_policy_loss(
            lp, jnp.asarray(batch["old_logp"]), jnp.asarray(batch["ref_logp"]),
            jnp.asarray(batch["advantages"]), jnp.asarray(loss_mask), kl_coef=0.05,
        )[0]
    )(jnp.asarray(batch["old_logp"]) + 0.01)  # fmt: skip
    grad = np.asarray(grad)
    assert (grad[:, :P] == 0).all()
    assert np.abs(grad[:, P:][loss_mask[:, P:] > 0]).max() > 0


@pytest.mark.slow  # three tiny K = 2 runs (~2 min on an idle 2-core CPU)
def test_sigkill_then_rerun_equals_uninterrupted_run_at_two_turns(mt_shared, tmp_path):
    """SIGKILL a K = 2 run mid step 3 (after the checkpoint of step 2), rerun the same
    command: the uninterrupted run's results. A script's real runtime differs between two
    executions (and it is in the observation the next turn reads), so two independent runs
    cannot be compared: the killed run is given the uninterrupted run's executions as its
    journal (what a resumed run reads back), and must then execute nothing new: every script
    it generates, before and after the restart, is one the uninterrupted run executed."""
    import os
    import shutil
    import signal
    import subprocess
    import time

    from tests.autoresearch.test_resume import outcome
    from tests.support.rl_fixtures import ROOT, main_cmd, run_main, tiny_flags

    data_dir, init_dir = mt_shared
    flags = tiny_flags(
        data_dir, init_dir, **MULTITURN, rl__steps=3, rl__eval_every=2, rl__keep_checkpoints=5
    )
    straight = tmp_path / "straight"
    proc = run_main(straight, flags, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wd = tmp_path / "killed"
    wd.mkdir()
    for name in ("anchors.jsonl", "heldout.jsonl"):
        shutil.copy(straight / name, wd / name)
    journal = (wd / "anchors.jsonl").read_text()
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        main_cmd(wd, flags), cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 900
    while not (wd / "checkpoints" / "2").is_dir():
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint of step 2 appeared"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (wd / "summary.json").exists()
    resumed = run_main(wd, flags, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from the checkpoint of step 2" in resumed.stdout + resumed.stderr
    assert outcome(wd) == outcome(straight)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (wd, straight))
    assert a["final_heldout_reward_by_turn"] == b["final_heldout_reward_by_turn"]
    assert (wd / "anchors.jsonl").read_text() == journal  # nothing executed anew
