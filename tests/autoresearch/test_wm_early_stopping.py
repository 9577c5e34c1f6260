"""WM pretraining to convergence: the within-task concordance it watches, the stopping rule,
which rows it watches, its config fields, and a real pretraining stage that keeps the best
parameters (hand numbers; the stage on the shared tiny setting)."""

import jax
import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import config as rlconfig
from wmrl.autoresearch import experiment, model_setup, stages, wm_pretraining
from wmrl.config_errors import ConfigError


def test_within_task_concordance_by_hand():
    # Task 0: rewards (.9, .5, .1), scores (.8, .9, .1): pairs (0,1) discordant, (0,2) and
    # (1,2) concordant. Task 1: rewards (.6, .6, .2), scores (.3, .5, .3): (0,1) equal
    # rewards (no pair), (0,2) a tie in score (one half), (1,2) concordant. 3.5 of 5.
    s = np.array([0.8, 0.9, 0.1, 0.3, 0.5, 0.3])
    y = np.array([0.9, 0.5, 0.1, 0.6, 0.6, 0.2])
    g = np.array([0, 0, 0, 1, 1, 1])
    assert wm_pretraining.within_task_concordance(s, y, g) == pytest.approx(3.5 / 5)
    assert wm_pretraining.within_task_concordance(-s, y, g) == pytest.approx(1.5 / 5)
    # Pairs across tasks never count: one row per task says nothing.
    assert wm_pretraining.within_task_concordance(s[:2], y[:2], np.array([0, 1])) is None


def test_early_stopping_rule_by_hand():
    watch = wm_pretraining.EarlyStopping(patience=2)
    got = [watch.update(step, v) for step, v in [(10, 0.5), (20, 0.7), (30, None), (40, 0.7)]]
    assert got == [True, True, False, False]  # an equal value is no new best
    assert watch.stop and watch.best == 0.7 and watch.best_step == 20
    watch = wm_pretraining.EarlyStopping(patience=2)
    for step, v in [(10, 0.5), (20, 0.4), (30, 0.6)]:
        watch.update(step, v)
    assert not watch.stop and watch.best_step == 30


def rows(valid):
    return {"valid": np.asarray(valid, bool)}


def test_stopping_rows_prefer_the_policy_samples(tmp_path):
    with_k = tiny_config(tmp_path, tmp_path, wm__policy_samples_per_task=4)
    without = tiny_config(tmp_path, tmp_path, wm__policy_samples_per_task=0)
    corpus, policy = rows([True]), rows([True, False])
    assert wm_pretraining.stopping_rows(with_k, corpus, policy) == (policy, "policy_samples")
    # Not fitted on policy samples (the benchmark's control): the corpus split.
    assert wm_pretraining.stopping_rows(without, corpus, policy) == (corpus, "corpus_validation")
    assert wm_pretraining.stopping_rows(with_k, corpus, rows([False])) == (
        corpus,
        "corpus_validation",
    )
    assert wm_pretraining.stopping_rows(with_k, None, None) == (None, None)


@pytest.mark.parametrize(
    "field, value",
    [("wm.seed", -2), ("wm.pretrain_eval_every", -1), ("wm.pretrain_patience", -3),
     ("wm.pretrain_patience", 0)],
)  # fmt: skip
def test_bad_fields_are_named(tmp_path, field, value):
    config = tiny_config(tmp_path / "d", tmp_path / "i", **{field.replace(".", "__"): value})
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as e:
        rlconfig.validate_autoresearch_config(config)
    assert e.value.field == f"config.{field}"


def test_wm_seed(tmp_path):
    assert wm_pretraining.wm_seed(tiny_config(tmp_path, tmp_path, seed=3)) == 4  # the old seed + 1
    assert wm_pretraining.wm_seed(tiny_config(tmp_path, tmp_path, seed=3, wm__seed=11)) == 11


def test_stage_saved_before_the_fields_loads_as_a_fixed_step_count(tmp_path):
    base = tiny_config(tmp_path, tmp_path)
    old = stages._fingerprint(base, "wm_pretrain")
    for k in ("wm.seed", "wm.pretrain_eval_every", "wm.pretrain_patience"):
        old.pop(k)
    fixed = tiny_config(tmp_path, tmp_path, wm__pretrain_eval_every=0, wm__pretrain_patience=5)
    assert rlconfig.HISTORY.differences(old, stages._fingerprint(fixed, "wm_pretrain")) == []
    stopping = tiny_config(tmp_path, tmp_path, wm__pretrain_eval_every=50)
    assert "wm.pretrain_eval_every" in rlconfig.HISTORY.differences(
        old, stages._fingerprint(stopping, "wm_pretrain")
    )


@pytest.mark.real  # the sandbox and the tiny pipeline's stages
def test_pretraining_stops_and_keeps_the_best_parameters(rl_shared, tmp_path, monkeypatch):
    """A real pretraining stage watching the corpus validation split, with the measurement
    scripted (0.5, 0.8, 0.6, 0.7): patience 2 stops it after the 4th of 10 possible steps and
    the stage saves the parameters of step 2, not the last ones."""
    data_dir, shared_init = rl_shared
    base = tiny_config(data_dir, shared_init)
    s = experiment.prepare_stages(base, shared_init, progress=False)
    config = tiny_config(
        data_dir, tmp_path, wm__pretrain_steps=10, wm__validation_every=2,
        wm__pretrain_eval_every=1, wm__pretrain_patience=2,
    )  # fmt: skip
    seen, values = [], iter([0.5, 0.8, 0.6, 0.7])

    def scripted(score_fn, params, watched):
        seen.append(jax.tree.map(np.asarray, params))
        return {"concordance": next(values), "within_task_spearman": None, "mse": 0.0}

    monkeypatch.setattr(wm_pretraining, "ranking_figures", scripted)
    vocab = model_setup.vocab_size(config, s.prepared.tokenizer)
    mesh, seed = model_setup.make_rl_mesh(config), wm_pretraining.wm_seed(config)
    wm = model_setup.build_wm(config, vocab, model_setup.adam(1e-3), mesh, seed)
    params, report = wm_pretraining.pretrain_wm(
        config, s.prepared, wm, tmp_path / "wm_pretrain", False
    )
    assert report["steps_trained"] == 4 and report["best_step"] == 2
    assert report["pretrain_steps"] == 10
    es = report["early_stopping"]
    assert es["rows"] == "corpus_validation" and es["best_concordance"] == 0.8
    assert [h["step"] for h in es["history"]] == [1, 2, 3, 4]
    best, last = seen[1], seen[3]
    same = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))
    assert same(jax.tree.map(np.asarray, params), best) and not same(best, last)
    loaded, _ = wm_pretraining.pretrain_wm(config, s.prepared, wm, tmp_path / "wm_pretrain", False)
    assert same(jax.tree.map(np.asarray, loaded), best)  # the saved stage holds them too
