"""The trainer with `suite.executor="ray"`: two WMRL steps of the tiny setting on a one-machine
Ray cluster started in-process (`suite.ray_address="local"`, one node, `suite.workers` slots)
equal the same steps through the local pool, and a run cut after its executions were
journalled resumes on Ray without executing anything again. Slow: four tiny runs."""

import json
import shutil

import pytest

from tests.support.rl_fixtures import tiny_config
from wmrl.autoresearch.experiment import run

pytestmark = [pytest.mark.real, pytest.mark.ray]  # real sandboxes, a Ray cluster

pytest.importorskip("ray", reason="the Ray extra (requirements-ray.txt) is not installed")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def outcome(wd):
    s = json.loads((wd / "summary.json").read_text())
    steps = [r for r in read_jsonl(wd / "metrics.jsonl") if r["kind"] == "step"]
    return {
        "final": s["final_heldout_reward"],
        "curve": [(c["step"], c["heldout_reward"]) for c in s["heldout_curve"]],
        "real_executions": s["real_executions"],
        "wm_calls": s["wm_calls"],
        "train_reward": [(r["step"], round(r["train_reward"], 6)) for r in steps],
        "anchor_status": [r["anchor_status"] for r in steps],
    }


def journal(wd):
    keys = ("step", "row", "sha", "status", "reward")
    return [tuple(j[k] for k in keys) for j in read_jsonl(wd / "anchors.jsonl")]


@pytest.fixture(scope="module")
def runs(rl_shared, tmp_path_factory):
    data_dir, init_dir = rl_shared
    root = tmp_path_factory.mktemp("ray_runs")
    local = run(tiny_config(data_dir, init_dir, mode="wmrl"), root / "local", progress=False)
    on_ray = tiny_config(
        data_dir, init_dir, mode="wmrl", suite__executor="ray", suite__ray_address="local"
    )
    remote = run(on_ray, root / "ray", progress=False)
    return root, local, remote, on_ray


@pytest.mark.slow
def test_two_wmrl_steps_on_ray_equal_the_local_pool(runs):
    root, local, remote, _ = runs
    assert remote["steps"] == local["steps"] == 2
    assert outcome(root / "ray") == outcome(root / "local")
    assert journal(root / "ray") == journal(root / "local")
    assert len(journal(root / "ray")) == remote["real_executions"] > 0


@pytest.mark.slow
def test_resumed_run_on_ray_reuses_the_anchor_journal(runs, tmp_path):
    root, _, _, on_ray = runs
    wd = tmp_path / "cut"
    shutil.copytree(root / "ray", wd)
    (wd / "summary.json").unlink()  # the run was cut after step 2's executions were journalled
    shutil.rmtree(wd / "checkpoints" / "2")  # ... and before its checkpoint
    before = journal(wd)
    run(on_ray, wd, progress=False)
    after = journal(wd)
    assert after == before  # nothing executed again, nothing lost
    assert outcome(wd) == outcome(root / "ray")
    steps = [r for r in read_jsonl(wd / "metrics.jsonl") if r["kind"] == "step"]
    assert steps[-1]["step"] == 2 and steps[-1]["reused_from_journal"] > 0
