"""The GPU suite's CPU dry run end to end (every part in its own process, one JSON), a failing
part recorded while the others still run, the wheel helper's requirement lines, the launcher."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wmrl.benchmarks import gpu_suite
from wmrl.tools import gpu_wheels
from wmrl.tools import prepare_gpu_artefacts as prep

ROOT = Path(__file__).resolve().parents[2]


def _suite(out_dir, artefacts, *flags) -> dict:
    cmd = [sys.executable, "-m", "wmrl.benchmarks.gpu_suite", f"--out_dir={out_dir}",
           f"--artefacts={artefacts}", "--dry_run", "--total_budget_s=900", *flags]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((Path(out_dir) / gpu_suite.JSON_NAME).read_text())


def _dry_run(artefacts, out_dir, parts: list[str]) -> dict:
    """Run the named parts of the dry run, check each succeeded; returns {part: result}."""
    report = _suite(out_dir, artefacts, f"--parts={','.join(parts)}")
    assert list(report["parts"]) == parts
    failed = {n: e.get("error") for n, e in report["parts"].items() if not e["ok"]}
    assert not failed, failed
    assert report["suite"]["dry_run"] and report["install"] is None
    return {n: e["result"] for n, e in report["parts"].items()}


# Slow (17 s): every part of the suite in one dry run; the parts are tested one by one below.
@pytest.mark.slow
def test_dry_run_of_every_part_but_the_rl_steps(tmp_path):
    """Without the RL stages, the artefacts need only the reference logits."""
    (tmp_path / "art").mkdir()
    prep.write_reference_logits(tmp_path / "art" / prep.LOGITS_NAME)
    names = [p.name for p in gpu_suite.parts(dry_run=True) if p.name != "wmrl_steps"]
    parts = _dry_run(tmp_path / "art", tmp_path / "out", names)
    assert parts["env"]["backend"] == "cpu" and "jax" in parts["env"]["versions"]
    check = parts["logits_check"]
    assert check["ok"] and check["float32_xla"]["max_abs_diff"] <= 1e-4
    assert check["bfloat16_xla"]["max_abs_diff_vs_cpu_float32"] > 0  # bf16 really ran
    step = parts["train_step_tiny_dpa"]
    assert step["attention_impl"] == "dot_product_attention"
    assert 0 < step["mfu"] < 1e-2  # a tiny model on a CPU is far below an H200's peak
    roll = parts["rollout_tiny"]
    assert roll["outputs_match"] and roll["time_to_first_token_s"] < roll["jitted_s"]


@pytest.mark.slow
def test_dry_run_of_the_whole_suite(rl_shared, tmp_path):
    """Every part, the RL steps from the carried stages included (~90 s on two idle cores)."""
    artefacts = rl_shared[0].parent  # <root>/data and <root>/init, as prepare lays them out
    built = prep.build(artefacts, dry_run=True, progress=False)
    assert not prep.missing_stages(artefacts) and built["total_mib"] < 64
    names = [p.name for p in gpu_suite.parts(dry_run=True)]
    rl = _dry_run(artefacts, tmp_path / "out", names)["wmrl_steps"]
    assert rl["steps"] == 2 and rl["stages_reused"] and rl["device"] == "cpu"
    assert [s["step"] for s in rl["per_step"]] == [1, 2]
    # B = 2 groups of G = 2, one anchor group per step: 2 real executions per step.
    assert rl["real_executions"] == 4 and rl["wm_calls"] == 8


def test_a_failing_part_is_recorded_and_the_others_still_run(tmp_path):
    """Artefacts without the reference logits: logits_check fails with the error, env runs."""
    report = _suite(tmp_path / "out", tmp_path / "empty", "--parts=logits_check,env")
    check, env = report["parts"]["logits_check"], report["parts"]["env"]
    assert not check["ok"] and "reference_logits.npz" in check["error"]
    assert env["ok"] and env["result"]["backend"] == "cpu"


def test_unknown_part_is_a_clear_error():
    with pytest.raises(SystemExit):
        gpu_suite.parse(["--out_dir=o", "--artefacts=a", "--parts=train_step_2b"])


def test_wheel_requirements_come_from_requirements_txt():
    lines = gpu_wheels.requirement_lines()
    by_name = {gpu_wheels.canonical(line.split("[")[0].split(">")[0]): line for line in lines}
    assert set(by_name) == {gpu_wheels.canonical(n) for n in gpu_wheels.NEEDED}
    assert by_name["flax"] == "flax>=0.12.8,<0.13"
    assert by_name["etils"].startswith("etils[epath]")
    kept = set(gpu_wheels.ON_DEVICE) - set(gpu_wheels.CARRY_ANYWAY)
    assert "jax" in kept and "flax" not in kept  # carried: pinned by us, small


def test_launcher_dry_run_prints_the_command_with_absolute_paths(tmp_path):
    script = ROOT / "launch" / "gpu_suite.sh"
    proc = subprocess.run(
        ["bash", str(script), "--dry_run", "w", "a", "o", "--", "--parts=env"],
        cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHON": "py"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        f"+ cd {ROOT} && py -m wmrl.benchmarks.gpu_suite --wheels={tmp_path}/w "
        f"--artefacts={tmp_path}/a --out_dir={tmp_path}/o --parts=env"
    )
    bad = subprocess.run(["bash", str(script), "w"], capture_output=True, text=True)
    assert bad.returncode == 2 and "expected WHEELS ARTEFACTS OUT_DIR" in bad.stderr


def test_packed_artefacts_unpack_to_the_built_folders(tmp_path):
    built = tmp_path / "built"
    for rel, text in (("data/suite/suite.json", "[]"), ("init/warmstart/done.json", "{}")):
        (built / rel).parent.mkdir(parents=True)
        (built / rel).write_text(text)
    (built / prep.LOGITS_NAME).write_bytes(b"npz")
    sizes = prep.pack(built, tmp_path / "carry")
    assert set(sizes) == {prep.ARCHIVE_NAME, prep.LOGITS_NAME}
    assert not (tmp_path / "carry" / "data").exists()  # only the archive travels
    where = prep.unpack(tmp_path / "carry", tmp_path / "unpacked")
    assert where == tmp_path / "unpacked"
    assert (where / "data/suite/suite.json").read_text() == "[]"
    assert (where / "init/warmstart/done.json").read_text() == "{}"
    assert (where / prep.LOGITS_NAME).read_bytes() == b"npz"
    assert prep.unpack(built, tmp_path / "elsewhere") == built  # a built folder is used as is
