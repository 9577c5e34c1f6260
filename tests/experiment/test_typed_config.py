"""The typed configs (`wmrl.experiment.config`): declared once, validated without mutation,
every error naming the field, shared features refused where they do not run, saved runs of
the old shape.

`tests/fixtures/saved_configs/` holds `config.json` files as runs wrote them before the
configs were typed (configs/autoresearch_tiny.py without the adaptive rule's parameters,
configs/embodied_push.py:tiny without the shared sections' fields).
"""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags
from ml_collections import config_flags

from wmrl.autoresearch import config as arconfig
from wmrl.autoresearch.experiment import check_resumable
from wmrl.bandits import config as bconfig
from wmrl.config_errors import ConfigError
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.fidelity import AdaptiveRhoConfig
from wmrl.core.routing import RoutingConfig
from wmrl.embodied import config as econfig
from wmrl.embodied import experiment as eexperiment
from wmrl.experiment import config as xconfig
from wmrl.experiment.sections import CorrectionConfig, RLConfig

ROOT = Path(__file__).resolve().parents[2]
SAVED = ROOT / "tests" / "fixtures" / "saved_configs"
NAN = float("nan")


def ar_config():
    return xconfig.load_config_file(ROOT / "configs" / "autoresearch_tiny.py")


def embodied_config(arg=None):
    return xconfig.load_config_file(ROOT / "configs" / "embodied_push.py", arg)


def bandit_config():
    return xconfig.load_config_file(ROOT / "configs" / "bandit.py")


def refused(validate, config, changes: dict, field: str) -> str:
    """`validate(config with changes)` raises a ConfigError for `field`; its message."""
    xconfig.set_fields(config, changes)
    before = config.to_json_best_effort()
    with pytest.raises(ConfigError) as e:
        validate(config)
    assert e.value.field == field, str(e.value)
    assert str(e.value).startswith(f"{field}: ")
    assert config.to_json_best_effort() == before  # validation changes nothing
    return str(e.value)


# ----------------------------------------------------------------------------- errors name fields


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("seed", -3, ">= 0"),
        ("target_reward", NAN, "finite number"),
        ("suite.workers", 0, ">= 1"),
        ("suite.executor", "slurm", "one of ('local', 'ray')"),
        ("env.turns", 0, "scripts per episode"),
        ("env.sft_episodes_per_task", -1, ">= 0"),
        ("data.mistake_rate", 1.5, "in [0.0, 1.0]"),
        ("data.vocab_size", 0, ">= 1"),
        ("policy.size", "huge", "'tiny'"),
        ("policy.sft_learning_rate", 0.0, "> 0"),
        ("wm.policy_validation_every", -1, ">= 0"),
        ("wm.online_learning_rate", NAN, "finite"),
        ("rl.groups_per_step", 0, ">= 1"),
        ("rl.seed", -2, "-1 = config.seed"),
        ("rl.anchor_lag", 2, "one of (0, 1)"),
        ("rl.eval_at_s", (5.0, NAN), "item 1"),
        ("rl.num_micro_batches", 3, "32 trajectories"),
        ("correction.min_groups", -1, ">= 0"),
        ("correction.uncertainty_share", 1.5, "[0.0, 1.0]"),
        ("correction.corr_low", 0.6, "< config.correction.corr_high"),
        ("correction.rho_half_life", 0.0, "> 0"),
        ("correction.rho_warmup_groups", -1, ">= 0"),
        ("correction.debias", "keyed", "cancel"),
        ("correction.denoise_target", 0.5, ">= 1.0"),
        ("correction.denoise_warmup_groups", 0, ">= 1"),
    ],
)  # fmt: skip
def test_autoresearch_errors_name_the_field(field, value, words):
    message = refused(
        arconfig.validate_autoresearch_config, ar_config(), {field: value}, f"config.{field}"
    )
    assert words in message


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("obs", "lidar", "'state', 'image'"),
        ("image.patch", 5, "must divide config.image.pixels=32"),
        ("env.colours", ("red", "red", "blue"), "three blocks"),
        ("env.timestep", 0.0, "> 0"),
        ("env.real_episode_cost_s", -1.0, ">= 0"),
        ("demos.episodes", 0, ">= 1"),
        ("policy.num_heads", 0, ">= 1"),
        ("wm.dynamics", "rnn", "'object', 'mlp'"),
        ("wm.contact_gate", 0.05, "wm.dynamics='mlp' only"),
        ("rl.groups_per_step", 0, ">= 1"),
        ("rl.ppo_epochs", 0, ">= 1"),
        ("rl.group_size", 1, "at least 2 samples"),
        ("rl.wm_trust_spread", -0.1, ">= 0"),
        ("correction.rho", 1.5, "in [0.0, 1.0]"),
        ("correction.min_slope", 1.0, "0.999999"),
        ("correction.bin_spacing", "log", "equal_mass"),
    ],
)  # fmt: skip
def test_embodied_errors_name_the_field(field, value, words):
    config = embodied_config("tiny")
    message = refused(econfig.validate_embodied_config, config, {field: value}, f"config.{field}")
    assert words in message


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("num_seeds", 0, ">= 1"),
        ("variants", (), "at least one"),
        ("variants", ("real", "bogus"), "item 1"),
        ("bandit.head_scales", (1.0, 0.0), "item 1"),
        ("bandit.batch_size", 60, "multiple of group_size=8"),
        ("bandit.wm_sampling", "mc", "'exact', 'heads'"),
        ("debias.offset_rule", "median", "'window', 'ema'"),
        ("debias.min_slope", 1.0, "< 1.0"),
        ("debias.reward_range", (1.0, 0.0), "low < high"),
        ("denoise.w_max", 0.5, ">= 1.0"),
    ],
)  # fmt: skip
def test_bandit_errors_name_the_field(field, value, words):
    message = refused(
        bconfig.validate_bandit_config, bandit_config(), {field: value}, f"config.{field}"
    )
    assert words in message


def test_the_deprecated_bandit_anchor_fraction_is_checked_as_rho():
    old_name = xconfig.set_fields(bandit_config(), {"bandit.anchor_fraction": 0.3})
    with pytest.warns(FutureWarning, match="anchor_fraction is deprecated"):
        bconfig.validate_bandit_config(old_name)
    message = refused(bconfig.validate_bandit_config, bandit_config(),
                      {"bandit.anchor_fraction": 1.5}, "config.bandit.anchor_fraction")  # fmt: skip
    assert "in [0.0, 1.0]" in message


def test_a_value_of_the_wrong_type_is_named():
    """A ConfigDict refuses a type change itself; a dict (a saved config.json) is checked by
    the schema."""
    saved = json.loads(ar_config().to_json_best_effort())
    saved["pretrained"]["remat"] = "yes"
    with pytest.raises(ConfigError, match=r"^config\.pretrained\.remat: must be True or False"):
        arconfig.parse_config(saved)
    saved = json.loads(embodied_config().to_json_best_effort())
    saved["rl"]["steps"] = 2.5
    with pytest.raises(ConfigError, match=r"^config\.rl\.steps: must be an integer >= 1, got 2\.5"):
        econfig.parse_config(saved)


def test_a_section_built_in_code_is_checked_too():
    """The typed sections refuse a bad value wherever they are built, naming the field
    relative to the section; frozen once built."""
    with pytest.raises(ConfigError, match=r"^min_pairs: must be an integer >= 0, got -1$"):
        CorrectionConfig(min_pairs=-1)
    c = CorrectionConfig(rho=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rho = 0.25


# ----------------------------------------------------------------------------- shared features


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"correction.adaptive_rho": True}, "config.correction.adaptive_rho"),
        ({"rl.anchor_lag": 1}, "config.rl.anchor_lag"),
        ({"routing": "uncertainty"}, "config.routing"),
        ({"rl.static_check": "names"}, "config.rl.static_check"),
    ],
)
def test_shared_features_embodied_does_not_run_are_refused_by_name(changes, field):
    """The shared sections carry them; embodied implements none, so each is refused rather
    than silently ignored (AutoResearch accepts the same settings)."""
    message = refused(econfig.validate_embodied_config, embodied_config("tiny"), changes, field)
    assert "embodied" in message
    ar = xconfig.set_fields(ar_config(), changes)
    arconfig.validate_autoresearch_config(ar)


def multiturn_config():
    return xconfig.load_config_file(ROOT / "configs" / "autoresearch_multiturn.py")


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"rl.anchor_lag": 1}, "config.rl.anchor_lag"),
        ({"wm.policy_samples_per_task": 4}, "config.wm.policy_samples_per_task"),
    ],
)
def test_what_does_not_apply_to_multi_turn_episodes_is_refused_by_name(changes, field):
    """K > 1: an anchor episode's next turn needs its real observation (no lag), and policy
    samples are single-turn scripts; both are refused rather than ignored. The single-turn
    config accepts the same settings."""
    message = refused(arconfig.validate_autoresearch_config, multiturn_config(), changes, field)
    assert "env.turns=3" in message
    arconfig.validate_autoresearch_config(xconfig.set_fields(ar_config(), changes))


def test_multi_turn_runs_the_shared_features_it_implements():
    """Adaptive rho, uncertainty routing (on turn 1's WM variance) and the static check run
    in multi-turn episodes: accepted, and in the trainer's settings."""
    c = xconfig.set_fields(multiturn_config(), {
        "correction.adaptive_rho": True, "routing": "uncertainty", "rl.static_check": "compile",
    })  # fmt: skip
    tc = arconfig.validate_autoresearch_config(c)
    assert tc.turns == 3 and tc.adaptive_rho is not None and tc.static_check == "compile"
    assert tc.routing.uncertainty_share == c.correction.uncertainty_share == 0.5


def test_adaptive_rule_parameters_reach_the_trainer():
    c = xconfig.set_fields(ar_config(), {
        "correction.adaptive_rho": True, "correction.corr_low": 0.1, "correction.corr_high": 0.7,
        "correction.rho_half_life": 4.0, "correction.rho_warmup_groups": 2,
    })  # fmt: skip
    rule = arconfig.validate_autoresearch_config(c).adaptive_rho
    assert rule == AdaptiveRhoConfig(
        rho=0.25, rho_min=0.125, rho_max=1.0, corr_low=0.1, corr_high=0.7, half_life=4.0,
        warmup_groups=2,
    )  # fmt: skip


# ----------------------------------------------------------------------------- one source


def test_correction_defaults_are_the_cores():
    """One source for each correction default: the core's dataclasses (and the bandit's
    sections take theirs from the same place)."""
    c, d, n, r = CorrectionConfig(), DebiasConfig(), DenoiseConfig(), RoutingConfig()
    a = AdaptiveRhoConfig()
    assert (c.rho, c.min_groups, c.uncertainty_share) == (r.rho, r.min_groups,
                                                           r.uncertainty_share)  # fmt: skip
    assert (c.rho_min, c.rho_max, c.corr_low, c.corr_high, c.rho_half_life,
            c.rho_warmup_groups) == (a.rho_min, a.rho_max, a.corr_low, a.corr_high, a.half_life,
                                     a.warmup_groups)  # fmt: skip
    assert c.adaptive_rho_config().rho == c.rho  # the rule starts at correction.rho
    assert c.debias_config(d.mode) == d
    assert c.denoise_config() == n
    b = bconfig.BanditConfig()
    assert bconfig.BanditDebiasConfig() == bconfig.BanditDebiasConfig(
        **{f.name: getattr(d, f.name) for f in dataclasses.fields(bconfig.BanditDebiasConfig)}
    )
    assert (b.denoise.half_life, b.denoise.warmup_groups) == (n.half_life, n.warmup_groups)
    assert b.bandit.rho == r.rho


@pytest.mark.parametrize(
    "name, arg, schema",
    [
        ("autoresearch_tiny", None, arconfig.AutoResearchConfig),
        ("autoresearch_multiturn", None, arconfig.AutoResearchConfig),
        ("qwen3_4b", None, arconfig.AutoResearchConfig),
        ("qwen3_8b", None, arconfig.AutoResearchConfig),
        ("embodied_push", None, econfig.EmbodiedConfig),
        ("embodied_push", "tiny", econfig.EmbodiedConfig),
        ("bandit", None, bconfig.BanditConfig),
    ],
)
def test_every_config_file_reads_into_its_schema_and_back_unchanged(name, arg, schema):
    """A config file is its schema's defaults with some values set: the typed config holds
    every field it has (the pod configs' `model` and `mesh_shape` too), nothing else."""
    c = xconfig.load_config_file(ROOT / "configs" / f"{name}.py", *([arg] if arg else []))
    typed = xconfig.parse(schema, c)
    assert json.loads(xconfig.to_config_dict(typed).to_json_best_effort()) == json.loads(
        c.to_json_best_effort()
    )
    assert xconfig.parse(schema, xconfig.defaults(schema)) == schema()


def test_command_line_overrides_set_the_typed_fields():
    """`--config.x.y=` overrides as documented (numbers, strings, tuples) reach the typed
    config, parsed by ml_collections as `wmrl.main` parses them."""
    argv = [
        "prog", f"--config={ROOT / 'configs' / 'autoresearch_tiny.py'}", "--config.mode=real",
        "--config.routing=uncertainty", "--config.rl.groups_per_step=4",
        "--config.correction.rho=0.5", "--config.rl.eval_at_s=(10,20.5)",
        "--config.suite.tasks=('iris-species','heldout-gaussian-quantiles')",
    ]  # fmt: skip
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
    fv(argv)
    typed = arconfig.parse_config(fv.config)
    assert (typed.mode, typed.routing, typed.rl.groups_per_step) == ("real", "uncertainty", 4)
    assert typed.correction.rho == 0.5 and typed.rl.eval_at_s == (10.0, 20.5)
    assert typed.suite.tasks == ("iris-species", "heldout-gaussian-quantiles")


def test_a_field_that_may_be_none_can_be_set_on_the_command_line():
    """`bandit.anchor_fraction` is None by default; ml_collections cannot override a plain
    None, so the defaults hold a typed placeholder (None in the saved config.json)."""
    from tests.support.main_in_process import config_from_command_line

    path = ROOT / "configs" / "bandit.py"
    assert config_from_command_line(path).bandit.anchor_fraction is None
    assert '"anchor_fraction": null' in config_from_command_line(path).to_json_best_effort()
    c = config_from_command_line(path, "--config.bandit.anchor_fraction=0.3")
    assert c.bandit.anchor_fraction == 0.3
    with pytest.warns(FutureWarning, match="anchor_fraction=0.3"):
        assert bconfig.validate_bandit_config(c).bandit.anchor_fraction == 0.3


# ----------------------------------------------------------------------------- renamed fields

RENAMED = r"rl\.tasks_per_step was renamed rl\.groups_per_step"


def test_both_experiments_call_the_groups_of_a_step_rl_groups_per_step():
    """B is `rl.groups_per_step` in every experiment (one field of the shared `RLConfig`)."""
    assert arconfig.parse_config(ar_config()).rl.groups_per_step == 8
    assert econfig.parse_config(embodied_config("tiny")).rl.groups_per_step == 4
    assert "groups_per_step" in {f.name for f in dataclasses.fields(RLConfig)}


@pytest.mark.parametrize("config", [ar_config, lambda: embodied_config("tiny")])
def test_a_config_that_sets_a_field_under_its_old_name_is_refused_naming_both(config):
    """A config file (a ConfigDict takes any new key) setting `rl.tasks_per_step`."""
    c = config()
    c.rl.tasks_per_step = 4
    validate = econfig.validate_embodied_config
    if c.experiment == "autoresearch":
        validate = arconfig.validate_autoresearch_config
    with pytest.raises(ConfigError, match=rf"^config\.rl\.tasks_per_step: {RENAMED}; set "
                       r"config\.rl\.groups_per_step instead$"):  # fmt: skip
        validate(c)


def test_a_command_line_override_under_the_old_name_is_refused_naming_both():
    """`--config.rl.tasks_per_step=4` (either spelling) is a ConfigError naming both fields
    (ml_collections alone would stop on it with a bare AttributeError)."""
    from tests.support.main_in_process import config_from_command_line
    from wmrl.experiment import renamed

    path = ROOT / "configs" / "autoresearch_tiny.py"
    with pytest.raises(ConfigError, match=RENAMED):
        config_from_command_line(path, "--config.rl.tasks_per_step=4")
    with pytest.raises(ConfigError, match=RENAMED):
        renamed.refuse_renamed_overrides(["wmrl.main", "--config.rl.tasks_per_step", "4"])
    renamed.refuse_renamed_overrides(["wmrl.main", "--", "--config.rl.tasks_per_step=4"])


@pytest.mark.real  # a subprocess of the entry point
@pytest.mark.parametrize("entry_point", ["wmrl.main", "wmrl.benchmarks.speedup"])
def test_the_entry_point_refuses_an_override_under_the_old_name(tmp_path, entry_point):
    """`python -m wmrl.main ... --config.rl.tasks_per_step=4` (or the speedup benchmark's):
    exit status 2, one line naming both fields, nothing written."""
    path = ROOT / "configs" / "autoresearch_tiny.py"
    proc = subprocess.run(
        [sys.executable, "-m", entry_point, f"--config={path}", "--config.rl.tasks_per_step=4",
         f"--workdir={tmp_path / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert re.search(rf"^error: config\.rl\.tasks_per_step: {RENAMED}", proc.stderr, re.M)
    assert not (tmp_path / "run").exists()


def test_greedy_evaluation_is_refused_not_ignored():
    """`rl.eval_greedy` is kept (saved runs and command lines have it) but nothing evaluates
    greedily: True is a named error instead of a setting that does nothing."""
    econfig.validate_embodied_config(xconfig.set_fields(embodied_config("tiny"),
                                                        {"rl.eval_greedy": False}))  # fmt: skip
    message = refused(econfig.validate_embodied_config, embodied_config("tiny"),
                      {"rl.eval_greedy": True}, "config.rl.eval_greedy")  # fmt: skip
    assert "not implemented" in message


# ----------------------------------------------------------------------------- saved runs


def _workdir_with(tmp_path, fixture: str) -> Path:
    wd = tmp_path / "run"
    wd.mkdir()
    shutil.copy(SAVED / fixture, wd / "config.json")
    return wd


def test_an_autoresearch_run_saved_before_the_typed_config_resumes(tmp_path):
    """The fields added since (the adaptive rule's parameters, `correction.debias`) compare
    as what it ran with; a changed field is named, with the flag that continues the run as
    it was for one it predates."""
    wd = _workdir_with(tmp_path, "autoresearch_tiny.json")
    saved = json.loads((wd / "config.json").read_text())
    assert saved["rl"]["tasks_per_step"] == 8 and "corr_low" not in saved["correction"]
    check_resumable(ar_config(), wd)  # its rl.tasks_per_step: 8 is rl.groups_per_step=8
    c = xconfig.set_fields(ar_config(), {"rl.groups_per_step": 4})
    with pytest.raises(ConfigError) as e:
        check_resumable(c, wd)
    assert "(fields: rl.groups_per_step)" in str(e.value)
    assert "(rl.groups_per_step, saved under its old name rl.tasks_per_step)" in str(e.value)
    c = xconfig.set_fields(ar_config(), {"correction.corr_high": 0.8})
    with pytest.raises(ConfigError) as e:
        check_resumable(c, wd)
    assert "--config.correction.corr_high=0.5 to continue it as it was" in str(e.value)


def test_an_embodied_run_saved_before_the_typed_config_resumes(tmp_path):
    """The shared sections' fields it predates compare as off (what it ran with)."""
    wd = _workdir_with(tmp_path, "embodied_push_tiny.json")
    saved = json.loads((wd / "config.json").read_text())
    assert saved["rl"]["eval_greedy"] is False and "routing" not in saved
    eexperiment.check_resumable(embodied_config("tiny"), wd)
    c = xconfig.set_fields(embodied_config("tiny"), {"correction.min_slope": 0.1})
    with pytest.raises(ConfigError, match=re.escape("(fields: correction.min_slope)")):
        eexperiment.check_resumable(c, wd)


# ----------------------------------------------------------------------------- no configs/

_VALIDATE_WITHOUT_CONFIGS = """
import sys
import ml_collections
import wmrl
assert wmrl.__file__.startswith(sys.argv[1]), wmrl.__file__
from wmrl.autoresearch.config import validate_autoresearch_config
from wmrl.config_errors import ConfigError

config = ml_collections.ConfigDict(__import__("json").loads(open(sys.argv[2]).read()))
validate_autoresearch_config(config)
config.rl.lerning_rate = 1e-3  # a misspelt field
try:
    validate_autoresearch_config(config)
except ConfigError as e:
    print("REFUSED", e)
else:
    print("ACCEPTED")
"""


@pytest.mark.real  # a subprocess importing a copy of the package without configs/
def test_validation_does_not_need_the_configs_folder(tmp_path):
    """From a copy of the package with no configs/ beside it (an installed package): a valid
    config passes and a misspelt field is still refused by name."""
    shutil.copytree(ROOT / "wmrl", tmp_path / "wmrl", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (tmp_path / "configs").exists()
    config = tmp_path / "config.json"
    config.write_text(ar_config().to_json_best_effort())
    proc = subprocess.run(
        [sys.executable, "-c", _VALIDATE_WITHOUT_CONFIGS, str(tmp_path), str(config)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == (
        "REFUSED config.rl.lerning_rate: unknown field (not in AutoResearchRL); unknown: "
        "lerning_rate"
    )
