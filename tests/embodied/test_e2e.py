"""End-to-end smoke of every embodied mode on the tiny setting (in-process, shared stages), the
correction core imported rather than copied, resume, and the command line."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import embodied_push
from wmrl.config_errors import ConfigError
from wmrl.core import correct, debias, denoise, grpo, routing
from wmrl.embodied import config as econfig
from wmrl.embodied import experiment, rl, stages
from wmrl.experiment.checkpoint import RunCheckpointer

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

ROOT = Path(__file__).resolve().parents[2]
MODES = ("real", "wm_only", "debias_only", "denoise_only", "wmrl", "static_anchors")
# The step driver's phase methods (`wmrl.experiment.step.StepAdapter`), which an adapter must
# name as the driver does: its `correct` phase calls the core's `correct_rewards`.
PHASES = {"clock", "keys", "sample", "route", "act", "correct", "update", "finish"}
# RL steps of the fixture's runs: 2 (the tiny config's) where a test needs a second step (the
# notebook reuses real and wmrl; static_anchors's score needs earlier anchors), else 1.
STEPS = {"real": 2, "wmrl": 2, "static_anchors": 2}


def tiny(init_dir, **overrides):
    c = embodied_push.get_config("tiny")
    c.init_dir = str(init_dir)
    for k, v in overrides.items():
        node = c
        *path, leaf = k.split("__")
        for p in path:
            node = node[p]
        node[leaf] = v
    return c


def steps_of(wd):
    recs = [json.loads(x) for x in (Path(wd) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == "step"], [r for r in recs if r["kind"] == "eval"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("embodied")
    out = {}
    for mode in MODES:
        config = tiny(root / "init", mode=mode, rl__steps=STEPS.get(mode, 1))
        out[mode] = (root / mode, experiment.run(config, root / mode))
    return root, out


def test_every_mode_runs_and_counts_its_episodes(runs):
    _, out = runs
    B, G = 4, 4  # the tiny setting: 4 groups of 4, rho 0.5 -> 2 anchor groups
    for mode, (wd, s) in out.items():
        steps = STEPS.get(mode, 1)
        real_groups = B if mode == "real" else 2
        assert s["real_executions"] == steps * real_groups * G, mode
        assert s["wm_episodes"] == steps * (B - real_groups) * G, mode
        for k in ("warmstart_heldout_success", "final_heldout_success"):
            assert 0.0 <= s[k] <= 1.0
        assert s["observations"] == "state"
        for f in (
            "metrics.jsonl",
            "summary.json",
            "plots/heldout_success.png",
            "plots/wm_diagnostics.png",
        ):
            assert (wd / f).exists(), (mode, f)
    # the stages ran once: the WM's pretraining rollouts are counted, `real` spends none
    assert out["real"][1]["stage_real_executions"]["wm_pretrain_rollouts"] == 0
    assert out["wmrl"][1]["stage_real_executions"]["wm_pretrain_rollouts"] == 16


def test_static_anchors_scores_every_imagined_episode_with_the_recent_anchor_mean(runs):
    _, out = runs
    wd = out["static_anchors"][0]
    steps, _ = steps_of(wd)
    assert steps[0]["imagined_success_calibrated"] == 0.0  # no anchors yet
    # step 2: the core's recent mean, an EMA (half-life 64 rows) of step 1's 8 anchor successes,
    # in row order; by hand from the replay (its last 8 episodes are step 1's anchors).
    ckpt = RunCheckpointer(wd, keep=2)
    y = ckpt.read_raw(1).host["success"][-8:]
    ckpt.close()
    w = 0.5 ** (np.arange(7, -1, -1) / 64.0)
    assert y.mean() == pytest.approx(steps[0]["real_success"])
    assert steps[1]["imagined_success_calibrated"] == pytest.approx((w * y).sum() / w.sum())


def test_modes_differ_only_where_they_should(runs):
    _, out = runs
    real, _ = steps_of(out["real"][0])
    wm_only, _ = steps_of(out["wm_only"][0])
    assert "imagined_success" not in real[0] and "imagined_success" in wm_only[0]
    # the same seed routes the same anchor groups in every WM mode: identical anchor rollouts
    # at step 1 (same policy), whatever the correction does afterwards
    firsts = {m: steps_of(out[m][0])[0][0]["real_success"] for m in MODES if m != "real"}
    assert len(set(firsts.values())) == 1, firsts


def test_replay_keeps_the_latest_episodes_first_in_first_out():
    """`wm.replay_size` bounds the WM's online data: the oldest episodes (the demos, then the
    BC rollouts, then old anchors) leave first, in order."""
    from wmrl.embodied import rollout

    def eps(ids):
        n = len(ids)
        obs = np.zeros((n, 3, 14), np.float32)
        obs[:, :, 0] = np.asarray(ids, np.float32)[:, None]
        return rollout.Episodes(
            words=np.zeros((n, 5), np.int32),
            task=np.zeros(n, np.int32),
            obs=obs,
            actions=np.zeros((n, 2), np.int32),
            logp=np.zeros((n, 2), np.float32),
            success=np.asarray([i % 2 for i in ids], np.float32),
        )

    old = eps([0, 1, 2])
    replay = {"obs": old.obs, "actions": old.actions, "task": old.task, "success": old.success}
    replay["progress"] = np.zeros(3, np.float32)
    out = rl.add_to_replay(replay, eps([3, 4, 5, 6]), size=5, push_distance=0.1)
    np.testing.assert_array_equal(out["obs"][:, 0, 0], [2, 3, 4, 5, 6])
    np.testing.assert_array_equal(out["success"], [0, 1, 0, 1, 0])
    assert all(len(v) == 5 for v in out.values())
    out = rl.add_to_replay(replay, eps([3]), size=5, push_distance=0.1)
    np.testing.assert_array_equal(out["obs"][:, 0, 0], [0, 1, 2, 3])


# ----------------------------------------------------------------------------- core imported


def test_embodied_code_has_no_copy_of_the_correction_core():
    """The correction maths lives in wmrl.core only: no definition of a core function here,
    no debiasing / denoising formula, and no direct use of the correction's pieces (the
    embodied trainer calls the shared `correct_rewards`, which calls `correct`)."""
    core_defs = set()
    for mod in (correct, debias, denoise, grpo, routing):
        src = Path(mod.__file__).read_text()
        core_defs |= {
            line.split("(")[0][4:] for line in src.splitlines() if line.startswith("def ")
        }
    assert {"group_advantages", "fuse_ensemble", "route_anchors", "apply_debias"} <= core_defs
    for path in (ROOT / "wmrl" / "embodied").glob("*.py"):
        src = path.read_text()
        defs = {
            line.strip().split("(")[0][4:]
            for line in src.splitlines()
            if line.strip().startswith("def ")
        }
        defs -= PHASES
        assert not defs & core_defs, (path.name, defs & core_defs)
        for marker in (
            # formulas of the core (monotone map, EMA, anchor weight, advantages)
            "isotonic",
            "pool-adjacent",
            "1.0 / v",
            "ema_norm",
            "decay**",
            "decay **",
            "half_life)",
            "1 + c",
            "1.0 - after",
            ".std(",
            # the correction's pieces, which only `wmrl.core.correct` may assemble
            "apply_debias",
            "update_debias",
            "update_denoise",
            "anchor_weight(",
            "group_advantages",
            "update_anchor_mean",
        ):
            assert marker not in src, (path.name, marker)
    rl_src = (ROOT / "wmrl" / "embodied" / "rl.py").read_text()
    assert "from wmrl.core import correct, debias, denoise, grpo, routing" in rl_src
    assert "correct.correct_rewards" in rl_src


def test_the_embodied_run_takes_its_rewards_from_the_shared_correct(runs, monkeypatch, tmp_path):
    """Observed, not grepped: a spy on `wmrl.core.correct.correct` during a 1-step run sees the
    mode's switches and the anchors' real successes, and what it returns is what the run
    trains on (zeroed rewards -> zero advantages -> the policy stays the BC policy)."""
    root, _out = runs
    calls, seen = [], {}
    real_correct = correct.correct

    def spy(corr, r_wm, anchor_env, anchor_index, **kw):
        calls.append(kw)  # at trace time (the trainer jits the correction)
        keep = lambda e, i: seen.update(env=np.asarray(e), index=np.asarray(i))
        jax.debug.callback(keep, anchor_env, anchor_index)  # the values, when it runs
        c = real_correct(corr, r_wm, anchor_env, anchor_index, **kw)
        return c._replace(rewards=c.rewards * 0.0)

    monkeypatch.setattr(correct, "correct", spy)
    # every group an anchor: the routing decides how many real episodes there are
    monkeypatch.setattr(
        routing, "route_anchors", lambda rng, n, cfg, *a, **k: (np.ones(n, bool), np.ones(n))
    )
    s = experiment.run(tiny(root / "init", mode="wmrl", rl__steps=1), tmp_path / "patched")
    assert len(calls) == 1  # traced once (jitted), for the one step
    c = calls[0]
    assert c["debias_on"] and c["denoise_on"] and not c["constant_on"] and c["group_size"] == 4
    assert s["real_executions"] == 16 and s["wm_episodes"] == 0
    assert s["final_heldout_success"] == s["warmstart_heldout_success"]
    first = steps_of(tmp_path / "patched")[0][0]
    # it was handed the 4 anchor groups' real successes (the run's own count of them)
    assert seen["env"].shape == (4, 4) and list(seen["index"]) == [0, 1, 2, 3]
    assert set(np.unique(seen["env"])) <= {0.0, 1.0}
    assert seen["env"].mean() == pytest.approx(first["real_success"])
    assert first["train_reward"] == 0.0
    # unchanged policy (KL to the BC policy 0 up to rounding), zero advantage
    assert first["pg_loss"] == 0.0 and first["kl"] == pytest.approx(0.0, abs=1e-9)


def test_each_mode_passes_its_row_of_the_shared_mode_table():
    """The embodied modes are the core table's rows (static_anchors: the constant-score control)."""
    for mode in MODES:
        spec = rl.MODE_SPECS[mode]
        want = correct.MODE_SPECS["static_anchors" if mode == "static_anchors" else mode]
        assert spec is want, mode
    assert rl.MODE_SPECS["static_anchors"].constant and not rl.MODE_SPECS["wmrl"].constant


def test_fused_score_by_hand():
    means = np.asarray([[0.2, 1.0], [0.8, 0.0]], np.float32)  # [M=2, N=2]
    log_vars = np.log(np.asarray([[0.1, 1.0], [0.3, 1.0]], np.float32))
    mu, var = rl.fused_score(jnp.asarray(means), jnp.asarray(log_vars), True)
    # inverse variance: (0.2/0.1 + 0.8/0.3) / (1/0.1 + 1/0.3) = 0.35, v = 1/(10 + 10/3) = 0.075
    np.testing.assert_allclose(mu, [0.35, 0.5], rtol=1e-5)
    np.testing.assert_allclose(var, [0.075, 0.5], rtol=1e-5)
    mu, var = rl.fused_score(jnp.asarray(means), jnp.asarray(log_vars), False)
    np.testing.assert_allclose(mu, [0.5, 0.5], rtol=1e-6)  # the members' mean
    np.testing.assert_allclose(var, [0.1, 0.5], rtol=1e-5)  # mean variance / M


def test_sample_fusion_resolves_by_mode_and_bad_values_name_the_field():
    want = {"wmrl": True, "denoise_only": True, "real": False}
    want |= {"wm_only": False, "debias_only": False, "static_anchors": False}
    assert {m: correct.resolve_fusion("auto", correct.MODE_SPECS[m]) for m in MODES} == want
    assert {correct.resolve_fusion("mean", correct.MODE_SPECS[m]) for m in MODES} == {False}
    assert {correct.resolve_fusion("inverse_variance", correct.MODE_SPECS[m]) for m in MODES} == {
        True
    }
    c = embodied_push.get_config("tiny")
    c.correction.sample_fusion = "median"
    with pytest.raises(ConfigError, match=r"config\.correction\.sample_fusion.*'median'"):
        econfig.validate_embodied_config(c)


def test_a_run_saved_with_auto_fusion_resumes_under_what_auto_meant():
    for mode, same in (("wmrl", "inverse_variance"), ("debias_only", "mean")):
        c = embodied_push.get_config("tiny")
        c.mode = mode
        saved = json.loads(c.to_json_best_effort())
        del saved["correction"]["sample_fusion"]  # saved before the field: auto
        for fusion in ("auto", same):
            c.correction.sample_fusion = fusion
            assert econfig.HISTORY.differences(saved, c) == [], (mode, fusion)
        c.correction.sample_fusion = "mean" if same == "inverse_variance" else "inverse_variance"
        assert econfig.HISTORY.differences(saved, c) == ["correction.sample_fusion"]


def test_sample_fusion_decides_whether_the_members_are_fused(runs, monkeypatch, tmp_path):
    """Observed in a 1-step run: `wmrl` with `mean` never calls the core's fusion, and
    `debias_only` with `inverse_variance` fuses every anchor and imagined episode with it."""
    root, _ = runs
    calls = []
    real_fuse = denoise.fuse_ensemble

    def spy(means, log_vars, axis=0):
        calls.append(means.shape)
        return real_fuse(means, log_vars, axis=axis)

    monkeypatch.setattr(denoise, "fuse_ensemble", spy)
    for mode, fusion, fused in (("wmrl", "mean", False), ("debias_only", "inverse_variance", True)):
        calls.clear()
        c = tiny(root / "init", mode=mode, rl__steps=1, correction__sample_fusion=fusion)
        s = experiment.run(c, tmp_path / mode)
        assert s["wm_episodes"] > 0
        # anchors (replayed) and imagined episodes, [M, episodes] each, or nothing
        n = sum(shape[1] for shape in calls)
        assert n == (s["real_executions"] + s["wm_episodes"] if fused else 0), (mode, calls)


# ----------------------------------------------------------------------------- resume


def outcome(wd):
    s = json.loads((Path(wd) / "summary.json").read_text())
    steps, evals = steps_of(wd)
    drop = ("wall_time_s", "real_s", "wm_score_s", "train_s", "wm_train_s")
    return {
        "summary": {
            k: s[k]
            for k in (
                "real_executions",
                "wm_episodes",
                "final_heldout_success",
                "warmstart_heldout_success",
            )
        },
        "steps": [{k: v for k, v in r.items() if k not in drop} for r in steps],
        "evals": [(e["step"], e["heldout_success"]) for e in evals],
    }


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(runs, tmp_path):
    """A run stopped after step 1's checkpoint (later files gone, a half-logged step left in
    metrics.jsonl) and rerun gives the uninterrupted run's results."""
    root, out = runs
    wd = tmp_path / "resumed"
    experiment.run(tiny(root / "init", mode="wmrl"), wd)
    # One Orbax checkpoint per checkpointed step (state, replay and meta), the newest two.
    assert sorted(p.name for p in (wd / "checkpoints").iterdir()) == ["1", "2"]
    assert {p.name for p in (wd / "checkpoints" / "2").iterdir()} >= {"state", "host", "meta"}
    (wd / "summary.json").unlink()
    shutil.rmtree(wd / "checkpoints" / "2")
    with open(wd / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "step", "step": 2, "train_reward": -1.0}) + "\n")
    experiment.run(tiny(root / "init", mode="wmrl"), wd)
    assert outcome(wd) == outcome(out["wmrl"][0])
    assert_same_checkpoints(wd, out["wmrl"][0])


def checkpoint_arrays(wd) -> dict:
    """Every array of every kept checkpoint, by step and path (`RunCheckpointer.read_raw`)."""
    ckpt = RunCheckpointer(wd, keep=2)
    out = {}
    for step in ckpt.all_steps():
        raw = ckpt.read_raw(step)
        for name, tree in (("state", raw.state), ("host", raw.host or {})):
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
                out[(step, name, jax.tree_util.keystr(path))] = np.asarray(x)
    ckpt.close()
    return out


def assert_same_checkpoints(wd, reference):
    """Bit-equal checkpoints: every array of the resumed run's equals the uninterrupted one's."""
    got, want = checkpoint_arrays(wd), checkpoint_arrays(reference)
    assert sorted(got) == sorted(want) and len(got) > 100
    for k, x in want.items():
        assert got[k].dtype == x.dtype, k
        np.testing.assert_array_equal(got[k], x, err_msg=str(k))


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(runs, tmp_path, capsys):
    """The finished wmrl run cut after its last checkpoint, whose arrays are torn: it is moved
    to checkpoints_corrupt/, step 1's is used, and step 2 redone gives the same run."""
    root, out = runs
    wd = tmp_path / "corrupt"
    shutil.copytree(out["wmrl"][0], wd)
    (wd / "summary.json").unlink()
    for f in (wd / "checkpoints" / "2" / "state").rglob("*"):
        if f.is_file() and f.stat().st_size > 0:
            f.write_bytes(b"\0" * 8)  # a torn write
    capsys.readouterr()
    experiment.run(tiny(root / "init", mode="wmrl"), wd)
    text = capsys.readouterr().out
    assert "checkpoints/2 could not be restored" in text and "falling back" in text
    (kept,) = (wd / "checkpoints_corrupt").iterdir()
    assert kept.name.startswith("2-") and (kept / "state").is_dir()
    assert outcome(wd) == outcome(out["wmrl"][0])
    assert_same_checkpoints(wd, out["wmrl"][0])


def legacy_save(self, step, state, meta, host=None):
    """What embodied runs wrote before their checkpoints were Orbax's (the removed
    `wmrl.embodied.checkpoint.save_tree` and the loop's writes, as they were)."""
    ck_dir = Path(self.directory)
    ck_dir.mkdir(parents=True, exist_ok=True)
    leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
    np.savez(ck_dir / f"step_{step}.npz", *leaves)
    np.savez(ck_dir / f"replay_{step}.npz", **(host or {"none": np.zeros(0)}))
    (ck_dir / f"meta_{step}.json").write_text(json.dumps(meta, indent=2) + "\n")


@pytest.mark.parametrize("mode", ["wmrl", "real"])
def test_a_legacy_npz_run_directory_resumes_and_continues_with_orbax(
    runs, tmp_path, monkeypatch, capsys, mode
):
    """A run directory of the `.npz` layout, cut after step 1 (`real`: an empty replay, its
    placeholder array), resumes from it and gives the uninterrupted run; step 2 is then an
    Orbax checkpoint and the legacy files are left as they were."""
    root, out = runs
    wd = tmp_path / "legacy"
    with monkeypatch.context() as m:
        m.setattr(experiment.RunCheckpointer, "save", legacy_save)
        experiment.run(tiny(root / "init", mode=mode), wd)
    ck = wd / "checkpoints"
    assert not [p for p in ck.iterdir() if p.is_dir()]  # no Orbax step
    (wd / "summary.json").unlink()
    for p in ck.glob("*_2.*"):
        p.unlink()
    legacy_files = sorted(p.name for p in ck.iterdir())
    assert legacy_files == ["meta_1.json", "replay_1.npz", "step_1.npz"]
    capsys.readouterr()
    experiment.run(tiny(root / "init", mode=mode), wd)
    assert "resuming from the legacy .npz checkpoint of step 1" in capsys.readouterr().out
    assert outcome(wd) == outcome(out[mode][0])
    assert sorted(p.name for p in ck.iterdir() if p.is_dir()) == ["2"]
    assert sorted(p.name for p in ck.iterdir() if p.is_file()) == legacy_files
    got = checkpoint_arrays(wd)
    want = {k: x for k, x in checkpoint_arrays(out[mode][0]).items() if k[0] == 2}
    assert sorted(got) == sorted(want)
    for k, x in want.items():
        assert got[k].dtype == x.dtype, k
        np.testing.assert_array_equal(got[k], x, err_msg=str(k))


def test_a_legacy_params_npz_stage_loads(runs, tmp_path, capsys):
    """A `bc` stage folder of the `.npz` layout (params.npz of the leaves, done.json) loads the
    same parameters as the Orbax one it was written from."""
    root, _ = runs
    config = tiny(root / "init", mode="wmrl")
    demos, _ = stages.demos_stage(config, root / "init" / "demos", None)  # finished: loaded
    _, params, report = stages.bc_stage(config, root / "init" / "bc", demos)
    old = tmp_path / "bc"
    shutil.copytree(root / "init" / "bc", old)
    shutil.rmtree(old / "params")
    np.savez(old / "params.npz", *[np.asarray(x) for x in jax.tree.leaves(params)])
    capsys.readouterr()
    _, back, old_report = stages.bc_stage(config, old, demos)
    assert "params.npz (a stage of an older wmrl)" in capsys.readouterr().out
    assert old_report == report and not (old / "params").exists()  # loaded, not rebuilt
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def main_cmd(wd, init_dir, *flags):
    return [
        sys.executable,
        "-m",
        "wmrl.main",
        "--config=configs/embodied_push.py:tiny",
        f"--workdir={wd}",
        f"--config.init_dir={init_dir}",
        *flags,
    ]


def test_command_line_writes_the_artefacts_and_refuses_bad_input(runs, tmp_path):
    root, _ = runs
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    wd = tmp_path / "cli"
    # The refused command beside the run (its own workdir, which it must not create).
    bad = subprocess.Popen(
        main_cmd(tmp_path / "bad", root / "init", "--config.policy.chunk=80"),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    proc = subprocess.run(
        main_cmd(wd, root / "init", "--config.rl.steps=1"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    _, bad_stderr = bad.communicate(timeout=300)
    assert bad.returncode == 2 and "config.policy.chunk" in bad_stderr
    assert not (tmp_path / "bad").exists()
    assert proc.returncode == 0, proc.stderr[-3000:]
    for f in ("config.json", "metrics.jsonl", "summary.json", "plots/heldout_success.png"):
        assert (wd / f).exists(), f
    s = json.loads((wd / "summary.json").read_text())
    assert {
        "warmstart_heldout_success",
        "final_heldout_success",
        "real_executions",
        "wm_episodes",
    } <= set(s)
    again = subprocess.run(
        main_cmd(wd, root / "init", "--config.rl.steps=1"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 2 and "finished run" in again.stderr


@pytest.mark.slow
def test_sigkill_then_rerun_equals_uninterrupted_run(runs, tmp_path):
    root, _ = runs
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    flags = ("--config.rl.steps=4",)
    straight = tmp_path / "straight"
    proc = subprocess.run(
        main_cmd(straight, root / "init", *flags), cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    wd = tmp_path / "killed"
    p = subprocess.Popen(
        main_cmd(wd, root / "init", *flags),
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not (wd / "checkpoints" / "2").is_dir():  # Orbax renames a complete step into place
        assert p.poll() is None, p.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (wd / "summary.json").exists()
    bad = subprocess.run(
        main_cmd(wd, root / "init", *flags, "--config.rl.learning_rate=0.5"),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "rl.learning_rate" in bad.stderr
    resumed = subprocess.run(
        main_cmd(wd, root / "init", *flags), cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert outcome(wd) == outcome(straight)


def test_notebook_executes_on_the_finished_tiny_runs(runs, monkeypatch):
    """colabs/embodied.ipynb headless, on the tiny setting: the fixture's finished `real` and
    `wmrl` runs are where the notebook puts them, so its runs resume at their last checkpoint
    (tests/colabs/test_embodied.py, slow, runs it from scratch)."""
    from tests.colabs.test_embodied import execute_notebook

    root, out = runs
    text, images = execute_notebook(monkeypatch, root)
    assert "final_heldout_success" in text and "mean within-group AUC" in text
    assert len(images) == 2
    assert f"'real_executions': {out['wmrl'][1]['real_executions']}" in text
