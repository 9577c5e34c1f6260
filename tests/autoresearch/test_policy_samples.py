"""The policy-sample stage (`wm.policy_samples_per_task`): the warm-started policy's scripts,
executed for real, cached under init_dir, reaching the WM pretraining; k = 0 is today's
pipeline."""

import shutil

import numpy as np
import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch import config as rlconfig
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import experiment, stages
from wmrl.autoresearch.env import executor as executor_mod
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.config_errors import ConfigError
from wmrl.jsonl import read_jsonl

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

# Two samples (rl.eval_samples' count: the held-out evaluation's sampler shapes, compiled
# once per session), the second held out (wm.policy_validation_every=2).
K, EVERY = 2, 2


def _lines(path) -> int:
    return len(read_jsonl(path))


@pytest.fixture(scope="module")
def built(rl_shared, tmp_path_factory):
    """prepare_stages with k = K on a fresh init_dir that starts from the shared warm start
    (copied: the warm start's fingerprint does not see wm.*)."""
    data_dir, shared_init = rl_shared
    base = tiny_config(data_dir, shared_init)
    experiment.prepare_stages(base, shared_init, progress=False)  # the shared stages, k = 0
    init = tmp_path_factory.mktemp("policy_samples") / "init"
    shutil.copytree(shared_init / "warmstart", init / "warmstart")
    config = tiny_config(
        data_dir, init, wm__policy_samples_per_task=K, wm__policy_validation_every=EVERY
    )
    s = experiment.prepare_stages(config, init, progress=False)
    return base, config, init, s


def test_stage_executes_policy_scripts_for_real(built):
    _base, config, init, s = built
    stage = init / stages.POLICY_SAMPLES
    records = read_jsonl(stage / stages.SAMPLES_FILE)
    tasks = s.prepared.train_tasks
    assert len(records) == len(tasks) * K == s.policy_samples_report["executions"]
    assert s.policy_samples_report["new_executions"] == len(records)
    assert _lines(stage / "executions.jsonl") == len(records)  # every one journalled
    assert [r["index"] for r in records] == list(range(K)) * len(tasks)
    for r in records:  # outcomes as the grader gives them
        st = Status(r["status"])
        if st == Status.VALID:  # 0.5 + 0.5 * leaderboard percentile
            assert 0.5 <= r["reward"] <= 1.0
        elif st == Status.UNGRADED:
            assert r["reward"] is None
        else:
            assert r["reward"] == pytest.approx(status_reward(st))
    # The first script again through a fresh pool with the same seed and key: same status.
    first = records[0]
    task = next(t for t in tasks if t.id == first["task_id"])
    with executor_mod.make_executor(config.suite, seed=config.seed) as pool:
        again = pool.run(task, first["script"], key=f"{stages.POLICY_SAMPLES}/0/0")
    assert int(again.status) == first["status"]
    assert again.reward == pytest.approx(first["reward"] if first["reward"] is not None else 0)
    # The stored completion is the sampled tokens: decoding them gives the script.
    assert s.prepared.tokenizer.decode(np.array(first["completion"])) == first["script"]
    assert stages.stages_done(config, init)


def test_rows_reach_pretraining(built):
    _base, config, init, s = built
    records = read_jsonl(init / stages.POLICY_SAMPLES / stages.SAMPLES_FILE)
    every = config.wm.policy_validation_every
    graded = [r for r in records if r["status"] != int(Status.UNGRADED)]
    fit = [r for r in graded if r["index"] % every != every - 1]
    held = [r for r in graded if r["index"] % every == every - 1]
    corpus = [
        r for r in s.prepared.executions
        if r["split"] == "train" and r["task_id"] in {t.id for t in s.prepared.train_tasks}
    ]  # fmt: skip
    rep = s.wm_report
    assert rep["train_examples"] == len(corpus) + len(fit)
    assert rep["policy_fit_examples"] == len(fit)
    assert rep["policy_validation"]["n"] == len(held) >= 1
    rows = stages.policy_sample_rows(config, s.prepared, records)
    assert len(rows["tokens"]) == len(graded)
    assert rows["script_index"].min() >= config.data.scripts_per_task
    P = config.data.max_prompt_len
    np.testing.assert_array_equal(rows["tokens"][0, P : P + len(graded[0]["completion"])],
                                  graded[0]["completion"])  # fmt: skip
    cap = config.suite.time_limit_s
    assert rows["time_limit_s"][0] == pytest.approx(rldata.time_limit(s.prepared.train_tasks[0],
                                                                      cap))  # fmt: skip


def test_second_call_reuses_the_stage_without_executing(built, monkeypatch):
    _base, config, init, s = built
    stage = init / stages.POLICY_SAMPLES
    n = _lines(stage / "executions.jsonl")

    def no_pool(*a, **k):
        raise AssertionError("the cached stage must not execute")

    monkeypatch.setattr(executor_mod, "make_executor", no_pool)
    records, report = stages.policy_samples(config, s.prepared, s.policy, s.policy_params, stage)
    assert len(records) == n and report["executions"] == n
    assert _lines(stage / "executions.jsonl") == n
    monkeypatch.undo()
    # Interrupted before done.json: the same scripts are sampled again, the journal reused.
    (stage / "done.json").unlink()
    (stage / stages.SAMPLES_FILE).unlink()
    again, report = stages.policy_samples(config, s.prepared, s.policy, s.policy_params, stage)
    assert report["new_executions"] == 0 and _lines(stage / "executions.jsonl") == n
    assert [r["script"] for r in again] == [r["script"] for r in records]
    assert [r["status"] for r in again] == [r["status"] for r in records]


def test_fingerprint_refuses_a_changed_k(built):
    _base, config, init, s = built
    other = tiny_config(
        config.data_dir, init, wm__policy_samples_per_task=K + 1, wm__policy_validation_every=EVERY
    )
    stage = init / stages.POLICY_SAMPLES
    with pytest.raises(ConfigError, match=r"wm\.policy_samples_per_task"):
        stages.policy_samples(other, s.prepared, s.policy, s.policy_params, stage)
    with pytest.raises(ConfigError, match=r"wm\.policy_samples_per_task"):
        stages.stages_done(other, init)


def test_k0_is_todays_pipeline(built, tmp_path):
    base, config, init, s = built
    assert stages.active_stages(base) == ("warmstart", "wm_pretrain")
    assert "wm.policy_samples_per_task" not in stages.STAGE_FIELDS["warmstart"]
    records, report = stages.policy_samples(
        base, s.prepared, s.policy, s.policy_params, tmp_path / "ps"
    )
    assert records == [] and report is None and not (tmp_path / "ps").exists()
    # A stage (or run) saved before the fields existed resumes with k = 0, not with k > 0.
    for stage in ("wm_pretrain",):
        old = stages._fingerprint(base, stage)
        for k in ("wm.policy_samples_per_task", "wm.policy_validation_every"):
            old.pop(k)
        assert rlconfig.HISTORY.differences(old, stages._fingerprint(base, stage)) == []
        with_k = tiny_config(config.data_dir, init, wm__policy_samples_per_task=8)
        assert rlconfig.HISTORY.differences(old, stages._fingerprint(with_k, stage)) == [
            "wm.policy_samples_per_task"
        ]
    shared = base.init_dir
    rep = stages.stage_done(stages.epath.Path(shared) / "wm_pretrain", base)
    assert "policy_validation" not in rep and "policy_fit_examples" not in rep
    train_ids = {t.id for t in s.prepared.train_tasks}
    corpus = [
        r for r in s.prepared.executions if r["split"] == "train" and r["task_id"] in train_ids
    ]
    assert rep["train_examples"] == len(corpus)  # the executed corpus alone


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"wm__policy_samples_per_task": -1}, "config.wm.policy_samples_per_task"),
        ({"wm__policy_validation_every": -2}, "config.wm.policy_validation_every"),
        ({"wm__policy_samples_per_task": 4, "env__turns": 2, "data__max_prompt_len": 400,
          "rl__anchor_lag": 0}, "config.wm.policy_samples_per_task"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(tmp_path, changes, field):
    config = tiny_config(tmp_path / "d", tmp_path / "i", **changes)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as e:
        rlconfig.validate_autoresearch_config(config)
    assert e.value.field == field
    assert not (tmp_path / "d").exists() and not (tmp_path / "i").exists()
