"""One name for each thing both experiments have (`wmrl.experiment.renamed`): saved configs
under the old field names compare as today's, records written under the old key names are
read as today's, and the old names are gone from the code.

The config side (a saved `rl.tasks_per_step`, the old name set by a config or on the command
line) is tested with the other saved configs in tests/experiment/test_typed_config.py."""

import json
import subprocess
from pathlib import Path

import jax
import numpy as np

from wmrl.experiment.config import ConfigHistory
from wmrl.experiment.renamed import FIELDS, KEYS, upgrade_keys

ROOT = Path(__file__).resolve().parents[2]


def test_upgrade_keys_renames_old_keys_at_any_depth_and_keeps_todays_records():
    old = {
        "kind": "eval", "real_episodes": 16, "bias_before": 0.25, "anchor_auc": 0.5,
        "stage_real_episodes": {"expert_demos": 24, "wm_pretrain_rollouts": 16},
        "heldout_curve": [{"step": 0, "real_episodes": 0}, {"step": 2, "real_episodes": 16}],
        "real_episodes_to_target": None, "eval_real_episodes": 60,
    }  # fmt: skip
    new = {
        "kind": "eval", "real_executions": 16, "residual_before": 0.25, "anchor_auc": 0.5,
        "stage_real_executions": {"expert_demos": 24, "wm_pretrain_rollouts": 16},
        "heldout_curve": [{"step": 0, "real_executions": 0}, {"step": 2, "real_executions": 16}],
        "real_executions_to_target": None, "eval_real_executions": 60,
    }  # fmt: skip
    assert upgrade_keys(old) == new and list(upgrade_keys(old)) == list(new)  # order kept
    assert upgrade_keys(new) == new
    assert upgrade_keys({"real_episodes": 1, "real_executions": 2}) == {"real_executions": 2}
    assert upgrade_keys([old, 3, "real_episodes"]) == [new, 3, "real_episodes"]  # keys only


def test_a_saved_config_under_an_old_field_name_compares_as_the_new_field():
    history = ConfigHistory(renamed=FIELDS)
    now = {"rl": {"groups_per_step": 4, "group_size": 2}}
    assert history.differences({"rl": {"tasks_per_step": 4, "group_size": 2}}, now) == []
    saved = {"rl": {"tasks_per_step": 8, "group_size": 2}}
    diff = history.differences(saved, now)
    assert diff == ["rl.groups_per_step"]
    assert history.hint(saved, diff) == (
        " (rl.groups_per_step, saved under its old name rl.tasks_per_step)"
    )
    assert ConfigHistory().differences(saved, now) == ["rl.groups_per_step", "rl.tasks_per_step"]


def test_an_embodied_run_written_under_the_old_keys_is_read_under_todays(tmp_path):
    """Resuming or summarising a run: its metrics.jsonl (`read_metrics`) and its stages'
    done.json reports (`stage_done`: the summary's `stage_real_executions` come from them)."""
    from configs import embodied_push
    from wmrl.embodied import experiment, stages

    records = [
        {"kind": "eval", "step": 0, "real_episodes": 0, "wm_episodes": 0},
        {"kind": "step", "step": 1, "real_episodes": 8, "bias_before": 0.1},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert experiment.read_metrics(tmp_path) == [
        {"kind": "eval", "step": 0, "real_executions": 0, "wm_episodes": 0},
        {"kind": "step", "step": 1, "real_executions": 8, "residual_before": 0.1},
    ]
    c = embodied_push.get_config("tiny")
    demos = tmp_path / "init" / "demos"
    demos.mkdir(parents=True)
    report = stages.finish_stage(demos, c, {"episodes": 24, "real_episodes": 24})
    assert report["real_episodes"] == 24  # as an older version wrote it
    assert stages.stage_done(demos, c)["real_executions"] == 24


def test_an_embodied_checkpoint_of_the_old_state_key_loads_in_place():
    """Legacy `.npz` checkpoints hold the RL state's leaves in order
    (`wmrl.embodied.legacy.load_npz_tree`); the counter's new key sorts where the old one did,
    so old checkpoints load with every leaf in place (Orbax ones were never written under the
    old key)."""
    state = {"corr": 0, "policy": 1, "policy_opt": 2, "step": 3, "wm": 4, "wm_episodes": 5,
             "wm_opt": 6}  # fmt: skip
    old = jax.tree.leaves({**state, "real_episodes": np.int64(7)})
    new = jax.tree.leaves({**state, "real_executions": np.int64(7)})
    assert old == new


def test_the_old_names_are_gone_from_the_code():
    """Outside the one list of renames, no module of wmrl/ (nor configs/) uses an old name."""
    names = [*(f.rpartition(".")[2] for f in FIELDS), *KEYS]
    pattern = "(" + "|".join(names) + ")"
    proc = subprocess.run(
        ["git", "grep", "-n", "-w", "-E", pattern, "--", "wmrl", "configs",
         ":!wmrl/experiment/renamed.py"],
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout  # 1: no match
    assert "tasks_per_step" in names and "real_episodes" in names and "bias_before" in names
