"""`python -m wmrl.main` on the bandit config, as a user runs it (the entry-point tests)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_main(workdir, *overrides):
    cmd = [
        sys.executable,
        "-m",
        "wmrl.main",
        "--config=configs/bandit.py",
        f"--workdir={workdir}",
        *overrides,
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)


TINY = (
    "--config.num_seeds=2",
    "--config.num_steps=40",
    "--config.log_points=4",
    "--config.variants=('real','wmrl')",
)
