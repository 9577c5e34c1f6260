"""The Colab notebook executes headless on a reduced setting, so it can never rot."""

import json
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support.notebooks import execute_notebook

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

ROOT = Path(__file__).resolve().parents[2]


def test_theory_bandits_notebook_executes(monkeypatch):
    text, images = execute_notebook(monkeypatch, "theory_bandits.ipynb")
    assert "final_suboptimality" in text and "wmrl" in text
    assert len(images) == 2
    assert os.path.exists(ROOT / "colabs" / "theory_bandits.ipynb")


def execute_ablations(monkeypatch, workdir, timeout):
    return execute_notebook(monkeypatch, "ablations.ipynb", workdir, timeout)


def test_ablations_notebook_on_finished_runs(monkeypatch, tmp_path):
    """Every cell after the runs (table, curves, calibration) on hand-written finished runs of
    every mode the notebook asks for, which the benchmark reuses instead of running RL: no
    stage is built and no mode trained (a mode missing from the fixture would be)."""
    from tests.support.speedup_fixtures import finished_benchmark
    from wmrl.benchmarks.speedup_runner import ALL_MODES

    modes = ALL_MODES
    finished_benchmark(tmp_path, modes)
    text, images = execute_ablations(monkeypatch, tmp_path, timeout=300)
    assert not (tmp_path / "shared").exists()  # nothing was built
    assert text.count("reusing the finished run") == len(modes)
    assert all(m in text for m in modes)
    assert "final_heldout_reward" in text and "time_to_target_ratio" in text
    # the hand-written pairs: raw MAE mean(|0.1 i - 0.5|, i < 10) = 0.25, debiased 0.05
    assert "MAE raw 0.250, debiased 0.050" in text
    assert len(images) == 2  # the reward curves and the calibration plot
    assert (tmp_path / "speedup.json").exists()


@pytest.mark.slow
def test_ablations_notebook_executes_tiny(monkeypatch, tmp_path):
    """The whole notebook on the tiny setting: shared stages, five WM and real modes of 2 RL
    steps each."""
    text, images = execute_ablations(monkeypatch, tmp_path, timeout=1200)
    assert "time_to_target_ratio" in text and "wm_only" in text
    assert len(images) == 2
    for m in ("real", "wm_only", "debias_only", "denoise_only", "wmrl"):
        summary = json.loads((tmp_path / m / "summary.json").read_text())
        assert summary["mode"] == m and 0.0 <= summary["final_heldout_reward"] <= 1.0
