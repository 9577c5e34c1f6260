"""Bad AutoResearch configs: clear errors naming the field, before anything is written."""

import json
import re
import warnings

import pytest

from tests.support.main_in_process import check_in_process
from tests.support.rl_fixtures import ROOT, load_config, tiny_config
from wmrl.autoresearch.config import HISTORY, validate_autoresearch_config
from wmrl.autoresearch.experiment import check_resumable, data_dir
from wmrl.config_errors import ConfigError
from wmrl.experiment.config import set_fields

NAN, INF = float("nan"), float("inf")
CONFIG_FILE = ROOT / "configs" / "autoresearch_tiny.py"


def test_default_config_is_valid():
    validate_autoresearch_config(load_config())


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("mode", "wm_plus", "config.mode"),
        ("routing", "random", "config.routing"),
        ("rl.group_size", 1, "config.rl.group_size"),
        ("rl.batch_size", 30, "config.rl.batch_size"),
        ("rl.baseline", "median", "config.rl.baseline"),
        ("suite.dir", "/nonexistent/suite", "config.suite.dir"),
        ("suite.tasks", ("iris-species", "no-such-task"), "config.suite.tasks"),
        ("suite.tasks", ("iris-species",), "config.suite.tasks"),
        ("correction.rho", 1.5, "config.correction"),
        ("rl.steps", 0, "config.rl.steps"),
        ("rl.static_check", "lint", "config.rl.static_check"),
        ("correction.sample_fusion", "median", "config.correction.sample_fusion"),
        ("rl.eval_at_s", (30.0, 10.0), "config.rl.eval_at_s: points must increase"),
        ("rl.eval_at_s", (0.0, 10.0), "config.rl.eval_at_s: item 0: must be a finite number > 0"),
        ("data.heldout_scripts_per_task", 0, "config.data.heldout_scripts_per_task: must be"),
        ("data.heldout_scripts_per_task", -2, "config.data.heldout_scripts_per_task: must be"),
        # Past a day (a task's own bound) the sandbox's waits no longer fit: every run UNGRADED.
        ("suite.time_limit_s", 1e9, "config.suite.time_limit_s: must be at most 86400 s"),
        ("suite.time_limit_s", 86_400.5, "config.suite.time_limit_s: must be at most"),
    ],
)
def test_bad_field_is_named(field, value, message):
    c = set_fields(load_config(), {field: value})
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        validate_autoresearch_config(c)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"correction.rho_min": 0.6, "correction.rho_max": 0.5}, "correction.rho_min"),
        ({"correction.rho_min": -0.1}, "correction.rho_min"),
        ({"correction.rho_max": 1.5}, "correction.rho_max"),
        ({"correction.rho_max": NAN}, "correction.rho_max"),
        ({"correction.adaptive_rho": True, "mode": "real"}, "correction.adaptive_rho"),
        ({"correction.adaptive_rho": True, "mode": "static_anchors"}, "correction.adaptive_rho"),
        ({"correction.adaptive_rho": True, "correction.rho_min": 0.5}, "correction.rho"),
        (
            {"correction.adaptive_rho": True, "correction.rho_min": 0.0, "correction.rho": 0.0,
             "correction.min_groups": 0},
            "correction.rho_min",
        ),
    ],
)  # fmt: skip
def test_bad_adaptive_rho_is_named(changes, field):
    c = set_fields(load_config(), changes)
    with pytest.raises(ConfigError, match="^" + re.escape(f"config.{field}: ")):
        validate_autoresearch_config(c)


def test_adaptive_rho_reaches_the_trainer_config():
    c = load_config()
    assert validate_autoresearch_config(c).adaptive_rho is None  # off by default
    c.correction.adaptive_rho, c.correction.rho_min, c.correction.rho_max = True, 0.125, 0.75
    rule = validate_autoresearch_config(c).adaptive_rho
    assert (rule.rho, rule.rho_min, rule.rho_max) == (0.25, 0.125, 0.75)
    for mode in ("wm_only", "debias_only", "denoise_only"):  # every mode with a WM stream
        c.mode = mode
        assert validate_autoresearch_config(c).adaptive_rho == rule


def test_cli_rho_min_above_rho_max_writes_nothing(tmp_path):
    wd = tmp_path / "wd"
    flags = ["--config.correction.rho_min=0.6", "--config.correction.rho_max=0.5"]
    code, stderr = check_in_process(CONFIG_FILE, wd, *flags)
    assert code == 2 and "error: config.correction.rho_min: (0.6) must be <=" in stderr, stderr
    assert not wd.exists()


def test_evaluations_at_wall_clock_points():
    from types import SimpleNamespace

    from wmrl.autoresearch.experiment import _eval_due_s

    c = load_config()
    c.rl.eval_at_s = (10.0, 20.0, 40.0)
    validate_autoresearch_config(c)
    due = lambda last, now: _eval_due_s(
        c, SimpleNamespace(evals=[{"wall_time_s": last}], wall_time_s=now)
    )
    assert not due(0.0, 9.9) and due(0.0, 10.0) and due(0.0, 35.0)  # two points: one eval
    assert not due(10.0, 19.0) and due(10.0, 20.0) and not due(20.0, 39.0) and due(20.0, 41.0)
    assert not due(41.0, 500.0)  # past the last point
    c.rl.eval_every_s = 25.0  # both triggers
    assert due(41.0, 50.0) and not due(50.0, 74.0)


def test_batch_size_sets_the_number_of_groups():
    c = load_config()
    c.rl.batch_size, c.rl.group_size = 24, 4
    assert validate_autoresearch_config(c).groups == 6


def test_zero_anchor_groups_with_debiasing_warns_and_uses_the_minimum():
    c = load_config()
    c.mode, c.correction.rho, c.correction.min_groups = "wmrl", 0.0, 0
    before = c.to_json_best_effort()
    with pytest.warns(UserWarning, match="zero anchor groups"):
        tc = validate_autoresearch_config(c)
    # The trainer uses the minimum; the config itself is left as it was (validation never
    # mutates: the resolved config.json and the resume check see what the user wrote).
    assert tc.routing.min_groups == 1
    assert c.to_json_best_effort() == before and c.correction.min_groups == 0
    c = load_config()
    c.mode, c.correction.rho, c.correction.min_groups = "wm_only", 0.0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no debiasing: zero anchors is a legitimate choice
        validate_autoresearch_config(c)


def test_incompatible_workdir_names_the_differing_fields(tmp_path):
    c = load_config()
    (tmp_path / "config.json").write_text(c.to_json_best_effort())
    check_resumable(c, tmp_path)  # same config: fine
    c.rl.steps = 80  # may change on resume (run longer)
    check_resumable(c, tmp_path)
    c.rl.group_size, c.wm.num_members = 8, 3
    assert HISTORY.differences(json.loads((tmp_path / "config.json").read_text()), c) == [
        "rl.group_size",
        "wm.num_members",
    ]
    with pytest.raises(ConfigError, match=r"rl\.group_size, wm\.num_members"):
        check_resumable(c, tmp_path)


def test_cli_unknown_mode_writes_nothing(tmp_path):
    wd = tmp_path / "run"
    code, stderr = check_in_process(CONFIG_FILE, wd, "--config.mode=fastest")
    assert code == 2 and "error: config.mode: unknown mode 'fastest'" in stderr, stderr
    assert not wd.exists()


@pytest.mark.parametrize("field", ["data_dir", "suite.dir"])
def test_remote_data_folders_are_refused(field):
    c = set_fields(load_config(), {field: "gs://bucket/data"})
    with pytest.raises(ConfigError, match=rf"config\.{field}: .* is not a local directory"):
        validate_autoresearch_config(c)


def test_data_stage_stays_local_for_a_remote_workdir(tmp_path, monkeypatch):
    monkeypatch.setenv("WMRL_CACHE_DIR", str(tmp_path / "cache"))
    c = load_config()
    assert data_dir(c, "gs://bucket/runs/x") == tmp_path / "cache/workdirs/gs/bucket/runs/x/data"
    assert data_dir(c, tmp_path / "run") == tmp_path / "run" / "data"
    c.data_dir = str(tmp_path / "shared")
    assert data_dir(c, "gs://bucket/runs/x") == tmp_path / "shared"


@pytest.mark.parametrize(
    "field, value",
    [
        ("rl.learning_rate", -1.0), ("rl.learning_rate", NAN), ("rl.temperature", 0.0),
        ("rl.temperature", -0.5), ("rl.clip_eps", -0.1), ("rl.kl_coef", NAN),
        ("suite.time_limit_s", 0.0), ("suite.time_limit_s", -3.0), ("suite.time_limit_s", NAN),
        ("suite.time_limit_s", INF), ("policy.num_layers", 0), ("wm.num_layers", 0),
        ("correction.bin_spacing", "quantile"), ("correction.min_slope", 1.0),
        ("correction.min_slope", NAN), ("correction.rho", -0.1), ("correction.rho", NAN),
        ("rl.std_eps", 0.0), ("rl.entropy_coef", -1.0), ("wm.rank_coef", NAN),
        ("wm.group_rows", 0),
    ],
)  # fmt: skip
def test_bad_number_is_named(field, value):
    c = set_fields(load_config(), {field: value})
    with pytest.raises(ConfigError, match="^" + re.escape(f"config.{field}: ")):
        validate_autoresearch_config(c)


def test_unknown_and_missing_fields_are_named():
    c = load_config()
    c.rl.lerning_rate = 1e-3  # a typo would otherwise be ignored silently
    with pytest.raises(ConfigError, match=r"^config\.rl\.lerning_rate: unknown field"):
        validate_autoresearch_config(c)
    c = load_config()
    del c.rl["anchor_lag"]  # a config file starts from every field's default
    with pytest.raises(ConfigError, match=r"^config\.rl\.anchor_lag: missing"):
        validate_autoresearch_config(c)


def test_more_workers_than_cores_warns(monkeypatch):
    import os

    c = load_config()
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    c.suite.workers = 3
    with pytest.warns(UserWarning, match=r"config\.suite\.workers=3 is above the 2 CPU cores"):
        validate_autoresearch_config(c)


def test_trainer_config_is_typed_frozen_and_takes_its_values_from_the_config():
    import dataclasses

    c = load_config()
    tc = validate_autoresearch_config(c)
    assert (tc.anchor_lag, tc.static_check) == (c.rl.anchor_lag, c.rl.static_check) == (1, "names")
    assert tc.groups == c.rl.groups_per_step and tc.routing.rho == c.correction.rho
    with pytest.raises(dataclasses.FrozenInstanceError):
        tc.anchor_lag = 0
    c.mode = "real"  # synchronous GRPO: no lag, no static check, every group executed
    tc = validate_autoresearch_config(c)
    assert (tc.anchor_lag, tc.static_check, tc.routing.rho) == (0, "off", 1.0)


def test_cli_nan_learning_rate_writes_nothing(tmp_path):
    wd = tmp_path / "wd"
    code, stderr = check_in_process(CONFIG_FILE, wd, "--config.rl.learning_rate=nan")
    assert code == 2 and "error: config.rl.learning_rate: must be a finite number" in stderr
    assert not wd.exists()


def test_anchor_lag_is_refused_with_multi_turn_episodes(tmp_path):
    """With K > 1 an anchor episode's next turn needs its real observation: a lag of one step
    cannot apply, and it is refused instead of being silently ignored."""
    c = tiny_config(tmp_path / "d", tmp_path / "i", env__turns=2, data__max_prompt_len=400)
    c.rl.anchor_lag = 1
    with pytest.raises(ConfigError, match=r"^config\.rl\.anchor_lag: must be 0 with env\.turns=2"):
        validate_autoresearch_config(c)
    c.rl.anchor_lag = 0
    validate_autoresearch_config(c)


def test_saved_runs_resume_under_what_their_fields_did(tmp_path):
    """A multi-turn run saved with anchor_lag 1 ran without a lag; a run saved before
    correction.sample_fusion fused by inverse variance in every mode: the same as `auto` in
    wmrl, not in wm_only (there it is named, with how to continue it as it was)."""
    config_differences, legacy_hint = HISTORY.differences, HISTORY.hint
    two = tiny_config(tmp_path / "d", tmp_path / "i", env__turns=2, data__max_prompt_len=400)
    saved = json.loads(two.to_json_best_effort())
    saved["rl"]["anchor_lag"] = 1
    two.rl.anchor_lag = 0
    assert config_differences(saved, two) == []
    for mode, differs in (("wmrl", False), ("wm_only", True)):
        c = tiny_config(tmp_path / "d", tmp_path / "i", mode=mode)
        saved = json.loads(c.to_json_best_effort())
        del saved["correction"]["sample_fusion"]
        diff = config_differences(saved, c)
        assert diff == (["correction.sample_fusion"] if differs else []), mode
        if differs:
            assert "--config.correction.sample_fusion=inverse_variance" in legacy_hint(saved, diff)
