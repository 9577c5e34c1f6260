"""World-model options of the AutoResearch trainer: the within-task Spearman report, grouped
pretraining batches, and a WM trunk taken from the (warm-started) policy."""

import jax
import numpy as np
from scipy import stats

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import model_setup, wm_metrics, wm_pretraining


def test_within_task_spearman_hand_numbers():
    scores = np.array([0.1, 0.2, 0.3, 0.9, 0.8, 0.7, 0.5, 0.5])
    targets = np.array([0.0, 0.5, 1.0, 0.1, 0.2, 0.3, 0.4, 0.6])
    group = np.array([0, 0, 0, 1, 1, 1, 2, 2])  # task 2: the WM gives one score, undefined
    out = wm_metrics.within_task_spearman(scores, targets, group)
    assert out["tasks"] == 2
    np.testing.assert_allclose(out["mean"], 0.0, atol=1e-6)  # +1 and -1
    pooled = stats.spearmanr(scores, targets).statistic
    assert abs(pooled) > 0.1  # the pooled figure says something else entirely


def test_grouped_rows_draw_tasks_times_their_scripts():
    group = np.repeat(np.arange(5), 7)
    rng = np.random.default_rng(0)
    idx = wm_pretraining.grouped_rows(rng, group, 16, 4)
    assert idx.shape == (16,)
    blocks = group[idx].reshape(4, 4)
    assert np.all(blocks == blocks[:, :1])  # each block of 4 rows is one task
    assert len(np.unique(blocks[:, 0])) == 4  # 4 distinct tasks (5 available)


def test_wm_trunk_from_policy_copies_the_policy_weights(tmp_path):
    config = tiny_config(tmp_path / "d", tmp_path / "i", wm__trunk_from_policy=True)
    mesh = model_setup.make_rl_mesh(config)
    policy = model_setup.build_policy(config, 64, model_setup.adam(1e-3), mesh, seed=0)
    wm = model_setup.build_wm(config, 64, model_setup.adam(1e-3), mesh, seed=1,
                         trunk_params=policy.state.params)  # fmt: skip
    trunk = wm.state.params["trunk"]
    jax.tree.map(
        lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
        trunk, policy.state.params,
    )  # fmt: skip
    assert wm.state.params["head_w1"].shape[1] == config.policy.d_model  # the policy's width
    plain = model_setup.build_wm(
        tiny_config(tmp_path / "d", tmp_path / "i"), 64, model_setup.adam(1e-3), mesh, seed=1
    )
    assert plain.state.params["head_w1"].shape[1] == config.wm.d_model


def test_split_validation_holds_out_every_kth_script_of_each_task():
    rows = {"script_index": np.tile(np.arange(8), 3), "group": np.repeat(np.arange(3), 8)}
    rows["x"] = np.arange(24)
    fit, val = wm_pretraining.split_validation(rows, 4)
    assert sorted(val["script_index"].tolist()) == [3, 3, 3, 7, 7, 7]
    assert len(fit["x"]) == 18 and not set(fit["x"]) & set(val["x"])
    same, none = wm_pretraining.split_validation(rows, 0)
    assert none is None and same is rows
