"""The shared run checkpoints (`wmrl.experiment.checkpoint`) and stage folders
(`wmrl.experiment.stages`), on real Orbax checkpoints on disk. The trainers' own use of them
is tested with their runs (tests/autoresearch/test_resume.py, tests/embodied/test_e2e.py)."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from wmrl.config_errors import ConfigError
from wmrl.experiment import stages as xstages
from wmrl.experiment.checkpoint import RunCheckpointer
from wmrl.experiment.config import ConfigHistory


def state_at(step: int) -> dict:
    """A run state whose every array is a function of the step (device and host arrays)."""
    return {
        "step": np.asarray(step, np.int32),
        "policy": {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) * step},
        "count": np.asarray(10 * step, np.int64),
    }


def replay_at(step: int) -> dict:
    """A host tree that grows with the step (restored in its saved shapes)."""
    return {"obs": np.arange(3 * step, dtype=np.float32).reshape(step, 3)}


def assert_tree_equal(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        if isinstance(a[k], dict):
            assert_tree_equal(a[k], b[k])
        else:
            x, y = np.asarray(a[k]), np.asarray(b[k])
            assert x.dtype == y.dtype and x.shape == y.shape, k
            np.testing.assert_array_equal(x, y)


def saved_run(tmp_path, steps=(1, 2, 3), keep=2) -> RunCheckpointer:
    ckpt = RunCheckpointer(tmp_path, keep)
    for s in steps:
        ckpt.save(s, state_at(s), {"step": s, "wall_time_s": 0.5 * s}, host=replay_at(s))
    return ckpt


def test_keeps_the_newest_and_restores_state_host_and_meta(tmp_path):
    ckpt = saved_run(tmp_path)
    assert ckpt.all_steps() == [2, 3]
    out = ckpt.restore_latest(state_at(0))
    assert out.step == 3 and out.meta == {"step": 3, "wall_time_s": 1.5}
    assert_tree_equal(out.state, state_at(3))
    assert_tree_equal(out.host, replay_at(3))  # [3, 3]: not the template's shape
    # Without host arrays (an empty replay) there is no host item.
    ckpt.save(4, state_at(4), {"step": 4}, host={})
    assert not (tmp_path / "checkpoints" / "4" / "host").exists()
    assert ckpt.restore_latest(state_at(0)).host is None
    ckpt.close()


def test_a_corrupt_latest_checkpoint_is_moved_aside_and_the_previous_one_used(tmp_path, capsys):
    saved_run(tmp_path).close()
    for f in (tmp_path / "checkpoints" / "3" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"\0" * 8)  # a torn write
    ckpt = RunCheckpointer(tmp_path, 2)
    out = ckpt.restore_latest(state_at(0))
    assert out.step == 2
    assert_tree_equal(out.state, state_at(2))
    assert_tree_equal(out.host, replay_at(2))
    text = capsys.readouterr().out
    assert "checkpoints/3 could not be restored" in text and "falling back" in text
    (kept,) = (tmp_path / "checkpoints_corrupt").iterdir()
    assert kept.name.startswith("3-") and (kept / "state").is_dir()
    assert ckpt.all_steps() == [2]
    ckpt.save(3, state_at(3), {"step": 3})  # the redone step saves again
    assert ckpt.all_steps() == [2, 3]
    ckpt.close()


def test_another_layout_is_refused_by_name_unless_only_new_leaves_are_missing(tmp_path):
    saved_run(tmp_path).close()
    newer = {**state_at(0), "extra": np.zeros(4, np.float32)}
    with pytest.raises(ConfigError, match=r"missing: extra; unexpected: none"):
        RunCheckpointer(tmp_path, 2).restore_latest(newer)
    assert (tmp_path / "checkpoints" / "3").is_dir()  # refused, not quarantined
    newer["extra"] = np.full(4, 7.0, np.float32)
    out = RunCheckpointer(tmp_path, 2, new_leaves=re.compile("^extra$")).restore_latest(newer)
    assert out.step == 3
    assert_tree_equal(out.state, {**state_at(3), "extra": np.full(4, 7.0, np.float32)})


def test_stage_folder_done_last_refused_by_field_and_cleared_when_half_written(tmp_path):
    history = ConfigHistory(added={"wm.gate": 0.0})
    stage = tmp_path / "init" / "wm"
    stage.mkdir(parents=True)
    (stage / "stale.npz").write_bytes(b"half")  # an interrupted attempt: no done.json
    fp = {"seed": 0, "wm.hidden": 32, "wm.gate": 0.0}
    assert xstages.done(stage, history, fp) is None
    params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.ones(4, np.float32)}
    xstages.begin(stage)
    assert list(stage.iterdir()) == []  # the earlier attempt cleared
    xstages.save_params(stage, params)
    assert xstages.done(stage, history, fp) is None  # params alone: not finished
    assert xstages.finish(stage, {"loss": 1.5}, fp)["config"] == fp
    assert xstages.done(stage, history, fp) == {"loss": 1.5, "config": fp}
    renamed = lambda r: {("nll" if k == "loss" else k): v for k, v in r.items()}
    assert xstages.done(stage, history, fp, upgrade=renamed) == {"nll": 1.5, "config": fp}
    back = xstages.load_params(stage, {k: np.zeros_like(v) for k, v in params.items()})
    assert_tree_equal({k: np.asarray(v) for k, v in back.items()}, params)
    with pytest.raises(ConfigError, match=r"config\.init_dir.*fields: wm\.hidden\)"):
        xstages.done(stage, history, {**fp, "wm.hidden": 64})
    # A stage saved before `wm.gate` existed compares at its legacy value.
    old = tmp_path / "init" / "old"
    old.mkdir()
    xstages.finish(old, {}, {"seed": 0, "wm.hidden": 32})
    assert xstages.done(old, history, fp) is not None
    with pytest.raises(ConfigError, match=r"fields: wm\.gate\).*--config\.wm\.gate=0\.0"):
        xstages.done(old, history, {**fp, "wm.gate": 0.5})
