"""Execute a notebook of `colabs/` headless on its tiny setting (the notebook tests)."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

from tests.support.multiprocess_helpers import xla_flags

ROOT = Path(__file__).resolve().parents[2]


def execute_notebook(monkeypatch, name: str, workdir=None, timeout: int = 600):
    """Run `colabs/<name>` headless on its tiny setting (WMRL_NOTEBOOK_FAST, in `workdir`);
    check no cell errored; returns (the text of its outputs, its image outputs)."""
    nb = nbformat.read(ROOT / "colabs" / name, as_version=4)
    monkeypatch.setenv("WMRL_NOTEBOOK_FAST", "1")
    if workdir is not None:
        monkeypatch.setenv("WMRL_NOTEBOOK_WORKDIR", str(workdir))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", xla_flags(None))  # one CPU device, as in Colab
    client = NotebookClient(
        nb,
        timeout=timeout,
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
