"""Smoke test of the bandit benchmark CLI: it runs, prints its table and writes the JSON keys."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

ROOT = Path(__file__).resolve().parents[2]


def test_bandit_benchmark_writes_table_and_json(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        "-m",
        "wmrl.benchmarks.bandits",
        f"--out={out}",
        "--num_seeds=4",
        "--num_steps=30",
        "--numpy_seeds=1",
        "--numpy_steps=20",
        "--variants=real,wmrl",
        "--devices=2",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "speedup_vs_numpy" in proc.stdout and "numpy loop" in proc.stdout
    data = json.loads(out.read_text())
    for key in ("run_s", "compile_s", "pulls_per_s", "speedup_vs_numpy"):
        assert data[key] > 0, key
    assert data["variants"] == ["real", "wmrl"]
    assert "x2" in data["machine"]  # seeds were sharded over 2 CPU devices
