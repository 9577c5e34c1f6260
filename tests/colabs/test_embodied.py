"""colabs/embodied.ipynb executes headless on the tiny setting (real and wmrl, 2 RL steps)."""

import json
import os
from pathlib import Path

import pytest

from tests.support.notebooks import execute_notebook as execute_colab

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

ROOT = Path(__file__).resolve().parents[2]


def execute_notebook(monkeypatch, workdir):
    """Run the notebook on the tiny setting in `workdir`; returns (text outputs, images)."""
    return execute_colab(monkeypatch, "embodied.ipynb", workdir, timeout=900)


@pytest.mark.slow
def test_embodied_notebook_executes_tiny_from_scratch(monkeypatch, tmp_path):
    text, images = execute_notebook(monkeypatch, tmp_path)
    assert "final_heldout_success" in text and "mean within-group AUC" in text
    assert len(images) == 2
    for mode in ("real", "wmrl"):
        summary = json.loads((tmp_path / mode / "summary.json").read_text())
        assert summary["mode"] == mode and 0.0 <= summary["final_heldout_success"] <= 1.0
    assert os.path.exists(tmp_path / "init" / "bc" / "done.json")
