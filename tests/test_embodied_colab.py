"""colabs/embodied.ipynb executes headless on the tiny setting (real and wmrl, 2 RL steps)."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute_notebook(monkeypatch, workdir):
    """Run the notebook on the tiny setting in `workdir`; returns (text outputs, images)."""
    nb = nbformat.read(ROOT / "colabs" / "embodied.ipynb", as_version=4)
    monkeypatch.setenv("WMRL_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("WMRL_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "colabs")}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = " ".join(
        str(o.get("data", {}).get("text/plain", "")) + str(o.get("text", "")) for o in outputs
    )
    return text, [o for o in outputs if "image/png" in o.get("data", {})]


@pytest.mark.slow
def test_embodied_notebook_executes_tiny_from_scratch(monkeypatch, tmp_path):
    text, images = execute_notebook(monkeypatch, tmp_path)
    assert "final_heldout_success" in text and "mean within-group AUC" in text
    assert len(images) == 2
    for mode in ("real", "wmrl"):
        assert (tmp_path / mode / "summary.json").exists()
    assert os.path.exists(tmp_path / "init" / "bc" / "done.json")
