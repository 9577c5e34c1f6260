"""The Colab notebook executes headless on a reduced setting, so it can never rot."""

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def test_theory_bandits_notebook_executes(monkeypatch):
    nb = nbformat.read(ROOT / "colabs" / "theory_bandits.ipynb", as_version=4)
    monkeypatch.setenv("WMRL_NOTEBOOK_FAST", "1")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "colabs")}},
    )
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = " ".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "final_suboptimality" in text and "wmrl" in text
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2
    assert os.path.exists(ROOT / "colabs" / "theory_bandits.ipynb")
