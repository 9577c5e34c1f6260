"""`python -m wmrl.main` end to end in a subprocess: artefacts, refusal to overwrite, bad config."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.bandit_cli import TINY, run_main

pytestmark = pytest.mark.real  # real sandboxes / processes / end-to-end runs

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_run_writes_artefacts_and_refuses_to_overwrite(tmp_path):
    wd = tmp_path / "run"
    proc = run_main(
        wd,
        *TINY,
        "--config.bandit.true_rewards=(1.0,0.5,0.2)",
        "--config.bandit.wm_bias=(0.0,0.6,0.0)",
        "--config.bandit.wm_noise=(0.1,0.1,0.1)",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cfg = json.loads((wd / "config.json").read_text())
    assert cfg["bandit"]["true_rewards"] == [1.0, 0.5, 0.2]  # tuple override resolved
    rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [10, 20, 30, 40]
    assert set(rows[0]["variants"]) == {"real", "wmrl"}
    summary = json.loads((wd / "summary.json").read_text())
    for v in ("real", "wmrl"):
        for key in (
            "final_suboptimality",
            "frac_seeds_optimal",
            "steps_to_threshold",
            "cost_to_threshold",
        ):
            assert key in summary["variants"][v]
    assert (wd / "plots" / "suboptimality_vs_steps.png").stat().st_size > 1000
    assert (wd / "plots" / "suboptimality_vs_cost.png").stat().st_size > 1000
    before = (wd / "summary.json").read_bytes()
    again = run_main(wd, *TINY)
    assert again.returncode != 0
    assert "already holds a finished run" in again.stderr
    assert (wd / "summary.json").read_bytes() == before


@pytest.mark.parametrize(
    "override,field",
    [
        ("--config.bandit.wm_bias=(0.0,0.25,0.0,0.05)", "config.bandit.wm_bias"),
        ("--config.bandit.wm_noise=(0.1,-0.2,0.3,0.3,0.3)", "config.bandit.wm_noise"),
        ("--config.bandit.anchor_fraction=1.5", "config.bandit.anchor_fraction"),
        ("--config.variants=('real','bogus')", "config.variants"),
    ],
)
def test_bad_config_names_field_and_writes_nothing(tmp_path, override, field):
    wd = tmp_path / "bad"
    proc = run_main(wd, override)
    assert proc.returncode != 0
    assert field in proc.stderr
    assert not wd.exists()


def test_a_workdir_that_cannot_be_written_is_refused_in_one_line(tmp_path):
    """A file in the workdir's place (or above it), or a read-only file system: once a raw
    traceback at the first write; now one line naming --workdir and a non-zero exit."""
    a_file = tmp_path / "afile"
    a_file.write_text("keep")
    readonly = tmp_path / "ro"
    readonly.mkdir()
    base = [sys.executable, "-m", "wmrl.main", "--config=configs/bandit.py", *TINY]
    cases = [
        ([*base, f"--workdir={a_file}"], f"--workdir: {a_file} is a file, not a directory"),
        ([*base, f"--workdir={a_file}/run"], f"cannot be made: {a_file} is a file"),
    ]
    if os.geteuid() == 0 and subprocess.run(["unshare", "-m", "true"]).returncode == 0:
        # A read-only mount seen by this command only (its own mount namespace).
        run = shlex.join([*base, f"--workdir={readonly}/run"])
        cases.append(
            (["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {readonly} && exec {run}"],
             f"--workdir: {readonly}/run cannot be written: {readonly} is read-only"),
        )  # fmt: skip
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        for cmd, _ in cases
    ]
    for p, (_, needle) in zip(procs, cases, strict=True):
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 2 and needle in stderr, stderr[-2000:]
        assert "Traceback" not in stderr, stderr[-2000:]
    assert a_file.read_text() == "keep" and list(readonly.iterdir()) == []
