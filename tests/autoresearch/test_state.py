"""`RunState` is a pytree that Orbax saves and restores as it is; a checkpoint written in the
layout of the dict-based trainer (before RunState was a pytree) resumes into it unchanged,
and a checkpoint of another layout is refused with a message, never restarted silently."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from wmrl.autoresearch.checkpoint import Checkpointer
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.state import Pending, Replay, RunState
from wmrl.config_errors import ConfigError
from wmrl.core.debias import DebiasConfig
from wmrl.core.state import init_correction_state


def small_state() -> RunState:
    """A RunState of the real types with tiny arrays (the train states are dicts here: the
    checkpoint code does not depend on what the policy is)."""
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32)}
    replay = Replay.empty(4, 5).add(
        {"tokens": np.arange(10).reshape(2, 5), "input_mask": np.ones((2, 5), bool)},
        np.array([0.25, 0.5], np.float32),
        np.array([int(Status.VALID), int(Status.RUNTIME_ERROR)], np.int32),
    )
    pending = Pending.empty(2, 5).replace(
        step=np.int64(3), rows=np.array([4, 5], np.int64),
        p_timeout=np.array([0.25, 0.75], np.float32),
    )  # fmt: skip
    return RunState(
        policy={"params": params, "opt": {"mu": jnp.ones((3, 2))}},
        ref_params=jax.tree.map(lambda x: x * 2, params),
        wm={"params": {"v": jnp.arange(4.0)}},
        correction=init_correction_state(DebiasConfig(mode="monotone", capacity=8)),
        replay=replay,
        pending=pending,
        rng=np.asarray(jax.random.key_data(jax.random.key(7))),
        step=4, wall_time_s=12.5, real_executions=8, wm_calls=16,
        evals=[{"step": 0, "wall_time_s": 0.0, "heldout_reward": 0.5}],
    )  # fmt: skip


def assert_same(a: RunState, b: RunState) -> None:
    assert a.counters() == b.counters()
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def fresh_like(st: RunState) -> RunState:
    """The template a new run builds: same shapes, zero counters, nothing pending."""
    zeros = jax.tree.map(lambda x: np.zeros_like(np.asarray(x)), st)
    return zeros.replace(step=0, wall_time_s=0.0, real_executions=0, wm_calls=0, evals=[])


def test_run_state_round_trips_through_orbax(tmp_path):
    st = small_state()
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(st, seed=0)
    back = ckpt.restore_latest(fresh_like(st))
    ckpt.close()
    assert_same(back, st)
    assert back.pending.valid and int(back.replay.count) == 2 and back.evals == st.evals


def test_checkpoint_in_the_dict_layout_of_the_old_trainer_resumes(tmp_path):
    """The old trainer saved a dict of dicts (`_tree`) with the counters in the JSON meta."""
    st = small_state()
    fields = lambda x: {k: getattr(x, k) for k in x.__dataclass_fields__}
    old_tree = {
        "policy": st.policy, "ref_params": st.ref_params, "wm": st.wm,
        "correction": st.correction, "replay": fields(st.replay),
        "pending": fields(st.pending), "rng": jax.random.key_data(jax.random.key(7)),
    }  # fmt: skip
    meta = {**st.counters(), "data_iterator": {"seed": 0, "next_step": st.step}}
    mgr = ocp.CheckpointManager(tmp_path / "checkpoints")
    mgr.save(st.step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(old_tree), meta=ocp.args.JsonSave(meta)))  # fmt: skip
    mgr.wait_until_finished()
    mgr.close()
    ckpt = Checkpointer(tmp_path, keep=2)
    back = ckpt.restore_latest(fresh_like(st))
    ckpt.close()
    assert_same(back, st)


def test_checkpoint_of_another_layout_is_refused_with_a_message(tmp_path):
    """A layout from before `rl.anchor_lag` (no `pending`) is refused naming what differs;
    the checkpoint is left where it is (not quarantined as corrupt, no silent restart)."""
    st = small_state()
    tree = {"policy": st.policy, "ref_params": st.ref_params, "wm": st.wm,
            "correction": st.correction, "replay": st.replay, "rng": st.rng}  # fmt: skip
    mgr = ocp.CheckpointManager(tmp_path / "checkpoints")
    mgr.save(4, args=ocp.args.Composite(
        state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(st.counters())))  # fmt: skip
    mgr.wait_until_finished()
    mgr.close()
    ckpt = Checkpointer(tmp_path, keep=2)
    with pytest.raises(ConfigError, match=r"another layout.*missing: pending/") as e:
        ckpt.restore_latest(fresh_like(st))
    ckpt.close()
    assert "new --workdir" in str(e.value)
    assert (tmp_path / "checkpoints" / "4").is_dir()
    assert not (tmp_path / "checkpoints_corrupt").exists()


def test_adaptive_rho_state_round_trips_and_a_run_without_it_keeps_its_layout(tmp_path):
    from wmrl.core.fidelity import AdaptiveRhoState
    from wmrl.experiment.checkpoint import tree_paths as _paths

    rule = AdaptiveRhoState(ema=jnp.float32(0.3), norm=jnp.float32(0.6), groups=jnp.int32(9))
    st = small_state().replace(adaptive_rho=rule)
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(st, seed=0)
    back = ckpt.restore_latest(fresh_like(st))
    ckpt.close()
    assert_same(back, st)
    assert int(back.adaptive_rho.groups) == 9
    # Off (None): no array of its own, the layout checkpoints had before the rule existed.
    assert not any(p.startswith("adaptive_rho") for p in _paths(small_state()))


def test_checkpoint_without_the_observation_arrays_resumes_with_them_from_the_template(tmp_path):
    """A checkpoint written before the replay carried observation targets and the WM had a
    runtime head (no `replay/runtime`, ..., no `wm/.../runtime_w1`) resumes: every array it
    has is restored, the new ones come from the template (unknown targets, fresh head)."""
    st = small_state()
    head = {"runtime_w1": jnp.full((4, 2), 3.0), "runtime_b2": jnp.full((2,), 5.0)}
    new = st.replace(wm={"params": {**st.wm["params"], **head},
                         "mu": {"v": jnp.ones(4), **head}})  # fmt: skip
    fields = lambda x: {k: getattr(x, k) for k in x.__dataclass_fields__}
    old_replay = {k: v for k, v in fields(st.replay).items()
                  if k not in ("runtime", "error_type", "validation")}  # fmt: skip
    old_tree = {
        "policy": st.policy, "ref_params": st.ref_params,
        "wm": {"params": st.wm["params"], "mu": {"v": jnp.ones(4)}},
        "correction": st.correction, "replay": old_replay, "pending": st.pending, "rng": st.rng,
    }  # fmt: skip
    mgr = ocp.CheckpointManager(tmp_path / "checkpoints")
    mgr.save(st.step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(old_tree), meta=ocp.args.JsonSave(st.counters())))  # fmt: skip
    mgr.wait_until_finished()
    mgr.close()
    like = fresh_like(new)
    like = like.replace(
        replay=Replay.empty(4, 5),
        wm={"params": {"v": jnp.zeros(4), **head}, "mu": {"v": jnp.zeros(4), **head}},
    )
    ckpt = Checkpointer(tmp_path, keep=2)
    back = ckpt.restore_latest(like)
    ckpt.close()
    assert back.step == st.step and int(back.replay.count) == 2
    np.testing.assert_array_equal(back.replay.tokens, st.replay.tokens)
    np.testing.assert_array_equal(back.replay.target, st.replay.target)
    assert np.isnan(back.replay.runtime).all() and (back.replay.error_type == -1).all()
    np.testing.assert_array_equal(back.wm["params"]["v"], st.wm["params"]["v"])
    np.testing.assert_array_equal(back.wm["mu"]["v"], np.ones(4))
    np.testing.assert_array_equal(back.wm["params"]["runtime_w1"], np.full((4, 2), 3.0))
    np.testing.assert_array_equal(back.policy["opt"]["mu"], np.ones((3, 2)))
    # New training after the resume adds known runtimes into the restored buffer.
    rp = back.replay.add(
        {"tokens": np.ones((1, 5), np.int32), "input_mask": np.ones((1, 5), bool)},
        np.array([0.7], np.float32), np.array([int(Status.VALID)], np.int32),
        runtime=np.array([1.5], np.float32),
    )  # fmt: skip
    assert int(rp.count) == 3 and rp.runtime[2] == np.float32(1.5)


def test_checkpoint_without_the_pending_p_timeout_resumes_with_it_unknown(tmp_path):
    """A checkpoint written before the pending anchors kept the WM's P(timeout) resumes: the
    pending rows come back as saved, their P(timeout) unknown (NaN, the template's)."""
    st = small_state()
    fields = lambda x: {k: getattr(x, k) for k in x.__dataclass_fields__}
    old_pending = {k: v for k, v in fields(st.pending).items() if k != "p_timeout"}
    old_tree = {
        "policy": st.policy, "ref_params": st.ref_params, "wm": st.wm,
        "correction": st.correction, "replay": st.replay, "pending": old_pending, "rng": st.rng,
    }  # fmt: skip
    mgr = ocp.CheckpointManager(tmp_path / "checkpoints")
    mgr.save(st.step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(old_tree), meta=ocp.args.JsonSave(st.counters())))  # fmt: skip
    mgr.wait_until_finished()
    mgr.close()
    like = fresh_like(st).replace(pending=Pending.empty(2, 5))
    ckpt = Checkpointer(tmp_path, keep=2)
    back = ckpt.restore_latest(like)
    ckpt.close()
    assert int(back.pending.step) == 3 and back.pending.rows.tolist() == [4, 5]
    assert np.isnan(back.pending.p_timeout).all()


def test_checkpoint_missing_an_array_that_is_not_new_is_still_refused(tmp_path):
    st = small_state()
    fields = lambda x: {k: getattr(x, k) for k in x.__dataclass_fields__}
    tree = {"policy": st.policy, "ref_params": st.ref_params, "wm": st.wm,
            "correction": st.correction,
            "replay": {k: v for k, v in fields(st.replay).items() if k != "target"},
            "pending": st.pending, "rng": st.rng}  # fmt: skip
    mgr = ocp.CheckpointManager(tmp_path / "checkpoints")
    mgr.save(4, args=ocp.args.Composite(
        state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(st.counters())))  # fmt: skip
    mgr.wait_until_finished()
    mgr.close()
    ckpt = Checkpointer(tmp_path, keep=2)
    with pytest.raises(ConfigError, match=r"missing: replay/target"):
        ckpt.restore_latest(fresh_like(st))
    ckpt.close()


def test_a_saved_config_without_the_new_wm_fields_compares_as_their_legacy_values():
    """A run (or stage) saved before `wm.runtime_coef` & co. existed did what those fields at
    0 do: it resumes with them at 0, and differs (named) from a config that turns one on."""
    from tests.support.rl_fixtures import load_config
    from wmrl.autoresearch.config import HISTORY

    config_differences, legacy_hint = HISTORY.differences, HISTORY.hint
    config = load_config()
    saved = json.loads(config.to_json_best_effort())
    for k in ("runtime_coef", "error_type_coef", "validation_coef"):
        del saved["wm"][k]
    config.wm.runtime_coef = 0.0
    assert config_differences(saved, config) == []
    config.wm.runtime_coef = 0.5
    diff = config_differences(saved, config)
    assert diff == ["wm.runtime_coef"]
    assert "--config.wm.runtime_coef=0.0" in legacy_hint(saved, diff)
    saved["wm"]["runtime_coef"] = 0.25  # a field the saved run had: no legacy hint
    assert legacy_hint(saved, config_differences(saved, config)) == ""


def test_run_state_checkpoint_without_a_wm_head_resumes_into_a_wm_with_it(tmp_path):
    """The same through `Checkpointer.save` of a real RunState (its own on-disk form)."""
    st = small_state()
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save(st, seed=0)
    head = {"error_w": jnp.full((4, 10), 2.0)}
    like = fresh_like(st).replace(wm={"params": {"v": jnp.zeros(4), **head}})
    back = ckpt.restore_latest(like)
    ckpt.close()
    np.testing.assert_array_equal(back.wm["params"]["v"], st.wm["params"]["v"])
    np.testing.assert_array_equal(back.wm["params"]["error_w"], np.full((4, 10), 2.0))
    assert_same(back.replace(wm=st.wm), st)
