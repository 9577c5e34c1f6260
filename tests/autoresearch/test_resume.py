"""Preemption for real: SIGKILL a run after a checkpoint, rerun the same command, and get
the uninterrupted run's results with no real execution lost or repeated. A corrupt latest
checkpoint falls back to the previous one. An incompatible config is refused."""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.support.rl_fixtures import ROOT, main_cmd, run_main, tiny_flags

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def outcome(wd):
    """What must not depend on the interruption: results, counts, per-step rewards."""
    s = json.loads((wd / "summary.json").read_text())
    steps = [r for r in read_jsonl(wd / "metrics.jsonl") if r["kind"] == "step"]
    return {
        "final": s["final_heldout_reward"],
        "curve": [
            (c["step"], c["heldout_reward"], c["real_executions"]) for c in s["heldout_curve"]
        ],
        "real_executions": s["real_executions"],
        "wm_calls": s["wm_calls"],
        "train_reward": [(r["step"], round(r["train_reward"], 6)) for r in steps],
        "anchor_weight": [round(r["anchor_weight"], 6) for r in steps],
    }


def journal_keys(wd):
    return [(j["step"], j["row"]) for j in read_jsonl(wd / "anchors.jsonl")]


@pytest.fixture(scope="module")
def flags(rl_shared):
    data_dir, init_dir = rl_shared
    return tiny_flags(data_dir, init_dir, rl__steps=4, rl__eval_every=2, rl__keep_checkpoints=5)


@pytest.fixture(scope="module")
def uninterrupted(flags, tmp_path_factory):
    wd = tmp_path_factory.mktemp("resume") / "straight"
    proc = run_main(wd, flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return wd


# `slow` (~45 s: a killed run and its rerun); the suite keeps the corrupt-checkpoint fallback
# below and the resumed tiny runs of tests/autoresearch/test_e2e.py and tests/embodied/test_e2e.py.
@pytest.mark.slow
def test_sigkill_then_rerun_equals_uninterrupted_run(flags, uninterrupted, tmp_path):
    wd = tmp_path / "killed"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen(
        main_cmd(wd, flags), cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 600
    while not (wd / "checkpoints" / "2").is_dir():  # step 2 complete (Orbax renames when done)
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no checkpoint of step 2 appeared"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its sandbox template, mid step 3
    proc.wait()
    assert not (wd / "summary.json").exists()
    before = set(journal_keys(wd))

    # An incompatible config is refused, naming the field, and nothing saved is touched.
    saved = sorted(p.relative_to(wd) for p in wd.rglob("*"))
    bad = run_main(wd, [*flags, "--config.rl.group_size=4", "--config.rl.learning_rate=0.1"])
    assert bad.returncode == 2
    assert "rl.group_size" in bad.stderr and "rl.learning_rate" in bad.stderr
    assert sorted(p.relative_to(wd) for p in wd.rglob("*")) == saved

    resumed = run_main(wd, flags)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from the checkpoint of step" in resumed.stdout + resumed.stderr
    keys = journal_keys(wd)
    assert len(keys) == len(set(keys))  # nothing executed twice
    assert before <= set(keys)  # no completed anchor pair lost
    assert outcome(wd) == outcome(uninterrupted)
    assert len(keys) == outcome(wd)["real_executions"]


def test_corrupt_latest_checkpoint_falls_back_to_the_previous(flags, uninterrupted, tmp_path):
    wd = tmp_path / "corrupt"
    shutil.copytree(uninterrupted, wd)
    (wd / "summary.json").unlink()  # pretend the run was cut after its last checkpoint
    latest = wd / "checkpoints" / "4"
    for f in latest.rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "state" in f.parts:
            f.write_bytes(b"\0" * 8)  # a torn write
    proc = run_main(wd, flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "could not be restored" in out and "falling back to the previous one" in out
    assert "resuming from the checkpoint of step 3" in out
    assert list((wd / "checkpoints_corrupt").iterdir())  # the bad checkpoint is kept aside
    assert outcome(wd) == outcome(uninterrupted)
