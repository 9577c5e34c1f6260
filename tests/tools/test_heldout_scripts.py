"""`wmrl.tools.heldout_scripts` on a real tiny run: the scripts it samples again from the final
checkpoint hash to what the run's held-out journal recorded (so they are the scripts that
were executed), each carries the journal's outcome, the static check's verdict agrees with
that outcome wherever it gives one, and a step without a checkpoint or a multi-turn run is
refused, naming the problem."""

import json
import subprocess
import sys

import pytest

from tests.support.rl_fixtures import ROOT, tiny_config
from wmrl.autoresearch.env.grader import Status
from wmrl.config_errors import ConfigError


def _finished_run(rl_shared, wd):
    from wmrl.autoresearch.experiment import run

    data_dir, init_dir = rl_shared
    config = tiny_config(data_dir, init_dir, mode="wmrl", rl__eval_samples=6)
    wd.mkdir()
    (wd / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")  # as wmrl.main
    run(config, wd, progress=False)
    return config


@pytest.mark.real  # the tiny pipeline's stages, its sandboxed executions and checkpoints
def test_heldout_scripts_are_the_executed_ones(rl_shared, tmp_path):
    from wmrl.tools.heldout_scripts import heldout_scripts, report, run_config

    wd = tmp_path / "run"
    config = _finished_run(rl_shared, wd)
    final = config.rl.steps
    journal = [json.loads(x) for x in (wd / "heldout.jsonl").read_text().splitlines()]
    executed = {r["row"]: r for r in journal if r["step"] == final}
    assert len(executed) == 6

    out = tmp_path / "scripts.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "wmrl.tools.heldout_scripts", f"--workdir={wd}", f"--out={out}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"step {final}: 6 of 6 scripts match the journal's hashes" in proc.stdout
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["row"] for r in rows] == list(range(6))
    for r in rows:
        rec = executed[r["row"]]
        assert r["matches_journal"] and r["sha"] == rec["sha"]
        assert (r["status"], r["reward"], r["error_type"]) == (
            rec["status"], rec["reward"], rec["error_type"]
        )  # fmt: skip
        if r["static"] is not None:  # the static check is never wrong where it speaks
            assert Status[r["static"]] == Status(rec["status"])

    # The config rebuilt from config.json is the run's; other steps are refused.
    assert run_config(ROOT / "configs" / "autoresearch_tiny.py", wd).rl.eval_samples == 6
    # A kept checkpoint whose step was not evaluated: sampled, said so, nothing joined.
    step, rows = heldout_scripts(config, wd, step=final - 1)
    assert step == final - 1 and len(rows) == 6
    assert not any(r["journalled"] or r["matches_journal"] for r in rows)
    assert all(r["status"] is None for r in rows)
    assert "no held-out evaluation of step 1 in the journal" in report(step, rows)
    with pytest.raises(ConfigError, match=r"step.*no checkpoint of it .*kept: \["):
        heldout_scripts(config, wd, step=final + 7)
    config.env.turns = 2
    with pytest.raises(ConfigError, match=r"env\.turns.*single-turn runs only"):
        heldout_scripts(config, wd)


def test_a_folder_without_a_run_is_refused(tmp_path):
    from wmrl.tools.heldout_scripts import run_config

    with pytest.raises(ConfigError, match="holds no run"):
        run_config(ROOT / "configs" / "autoresearch_tiny.py", tmp_path)
