"""Reporting in the benchmarks' terms: one execution's verdict, one held-out evaluation, several
seeds (mean ± one standard error) through the report CLI, and the trainer's held-out
evaluation on a suite of imported competitions, end to end.

Expected figures are worked out by hand from the verdicts written into each case.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from wmrl.autoresearch.env.competitions.report import (
    heldout_benchmark,
    seed_report,
    verdict_row,
)
from wmrl.autoresearch.env.grader import Status

REPO = Path(__file__).resolve().parents[3]
MB = SimpleNamespace(id="mb", competition={"benchmark": "mlebench"})
MD = SimpleNamespace(id="md", competition={"benchmark": "mledojo"})
PLAIN = SimpleNamespace(id="plain", competition=None)


def mb_verdict(medal, above, position):
    return {"benchmark": "mlebench", "score": 1.0, "medal": medal, "any_medal": medal is not None,
            "above_median": above, "position_score": position}  # fmt: skip


def md_verdict(position):
    return {"benchmark": "mledojo", "score": 1.0, "position_score": position, "positions": {}}


def test_a_verdict_row_is_nan_where_a_term_does_not_apply():
    assert verdict_row(MB, Status.VALID, mb_verdict("silver", True, 0.8)) == (2.0, 1.0, 0.8)
    assert verdict_row(MB, Status.INVALID_SUBMISSION, None) == (0.0, 0.0, 0.0)
    medal, above, pos = verdict_row(MD, Status.VALID, md_verdict(0.25))
    assert math.isnan(medal) and math.isnan(above) and pos == 0.25
    assert verdict_row(MD, Status.RUNTIME_ERROR, None)[2] == 0.0
    assert all(math.isnan(v) for v in verdict_row(MB, Status.UNGRADED, None))
    assert all(math.isnan(v) for v in verdict_row(PLAIN, Status.VALID, None))


def evaluation(rows):
    """`execute_scripts`'s verdict arrays from (task, status, benchmark) rows."""
    values = np.array([verdict_row(t, s, b) for t, s, b in rows], float)
    return {"medal": values[:, 0], "above_median": values[:, 1], "position_score": values[:, 2]}


def test_one_evaluation_in_the_benchmarks_terms():
    # k = 2 scripts per task. mb: gold + runtime error -> any medal 1/2, gold 1/2, above 1/2,
    # position (1.0 + 0) / 2. md: positions 0.6 and (ungraded: left out) -> 0.6.
    rows = [
        (MB, Status.VALID, mb_verdict("gold", True, 1.0)),
        (MB, Status.RUNTIME_ERROR, None),
        (MD, Status.VALID, md_verdict(0.6)),
        (MD, Status.UNGRADED, None),
        (PLAIN, Status.VALID, None),
        (PLAIN, Status.VALID, None),
    ]
    out = heldout_benchmark([MB, MD, PLAIN], 2, evaluation(rows))
    assert out["competitions"] == 2 and out["mlebench_competitions"] == 1
    assert out["any_medal_pct"] == pytest.approx(50.0)
    assert out["gold_pct"] == pytest.approx(50.0)
    assert out["above_median_pct"] == pytest.approx(50.0)
    assert out["position_score"] == pytest.approx((0.5 + 0.6) / 2)
    assert out["per_task"]["md"]["position_score"] == pytest.approx(0.6)
    assert "any_medal" not in out["per_task"]["md"]
    assert heldout_benchmark([PLAIN], 2, evaluation(rows[4:])) is None


def eval_record(step, reward, medal_pct, above_pct, position):
    return {"kind": "eval", "step": step, "heldout_reward": reward,
            "heldout_benchmark": {"any_medal_pct": medal_pct, "gold_pct": 0.0,
                                  "above_median_pct": above_pct, "position_score": position,
                                  "per_task": {"mb": {}, "md": {}}}}  # fmt: skip


def test_seeds_report_mean_and_one_standard_error():
    evals = [eval_record(4, 0.6, 50.0, 50.0, 0.4), eval_record(4, 0.7, 0.0, 100.0, 0.6),
             eval_record(4, 0.8, 100.0, 0.0, 0.5)]  # fmt: skip
    out = seed_report(evals)
    assert out["seeds"] == 3 and out["competitions"] == ["mb", "md"]
    # any medal: 50, 0, 100 -> mean 50, sd 50, SE 50 / sqrt(3)
    assert out["any_medal_pct"]["mean"] == pytest.approx(50.0)
    assert out["any_medal_pct"]["se"] == pytest.approx(50.0 / math.sqrt(3))
    assert out["position_score"]["mean"] == pytest.approx(0.5)
    assert out["position_score"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert out["heldout_reward"]["mean"] == pytest.approx(0.7)
    assert out["heldout_reward"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    other = eval_record(4, 0.7, 0.0, 0.0, 0.5)
    other["heldout_benchmark"]["per_task"] = {"mb": {}}
    with pytest.raises(ValueError, match="different competitions"):
        seed_report([*evals, other])


def write_run(path: Path, records) -> Path:
    path.mkdir()
    lines = [json.dumps({"kind": "step", "step": 1})] + [json.dumps(r) for r in records]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def report_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "wmrl.autoresearch.env.competitions.report", *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.real
def test_the_report_cli_reads_each_runs_last_evaluation(tmp_path):
    runs = [
        write_run(tmp_path / "s0", [eval_record(2, 0.1, 0.0, 0.0, 0.0),
                                    eval_record(4, 0.6, 50.0, 50.0, 0.4)]),
        write_run(tmp_path / "s1", [eval_record(4, 0.7, 0.0, 100.0, 0.6)]),
        write_run(tmp_path / "s2", [eval_record(4, 0.8, 100.0, 0.0, 0.5)]),
    ]  # fmt: skip
    out = report_cli(f"--runs={','.join(map(str, runs))}", f"--out={tmp_path / 'r.json'}")
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["any_medal_pct"]["per_seed"] == [50.0, 0.0, 100.0]  # s0's last, not step 2
    assert "| any medal (%) | 50.000 ± 28.868 |" in out.stdout, out.stdout
    out = report_cli(f"--runs={','.join(map(str, runs))}", "--step=2")
    assert out.returncode == 2 and "no held-out evaluation at step 2" in out.stderr
    out = report_cli(f"--runs={runs[0]},{runs[1]}")
    assert out.returncode == 2 and "at least 3 seeds" in out.stderr, out.stderr


@pytest.mark.real
def test_the_trainers_heldout_evaluation_reports_in_the_benchmarks_terms(tmp_path):
    """A suite of imported competitions (one of each benchmark trained on, one of each held
    out) through the data stage, the warm start and the trainer's held-out evaluation: the
    evaluation record carries `heldout_benchmark`, equal to the figures recomputed here from
    the journalled executions."""
    from tests.support.competition_fixtures import import_both
    from tests.support.rl_fixtures import tiny_config
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.trainer import Trainer

    suite = import_both(tmp_path / "competitions")
    for name, split in (("mb-toxic-tags", "heldout"), ("md-flower-kind", "train")):
        meta = json.loads((suite / name / "task.json").read_text())
        (suite / name / "task.json").write_text(json.dumps({**meta, "split": split}))
    config = tiny_config(tmp_path / "data", tmp_path / "init", suite__dir=str(suite),
                         data__max_prompt_len=160)  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    s = prepare_stages(config, run, progress=False)
    assert sorted(t.id for t in s.prepared.heldout_tasks) == ["mb-toxic-tags", "md-leaf-probs"]
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = Trainer(config, s.prepared, s.policy, s.wm, pool, run)
    try:
        ev = trainer.evaluate(trainer.initial_state(s.policy_params, s.wm_params))
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    journal = [json.loads(x) for x in (run / "heldout.jsonl").read_text().splitlines() if x]
    assert len(journal) == 2 * config.rl.eval_samples
    bench = ev["heldout_benchmark"]
    assert bench["competitions"] == 2 and bench["mlebench_competitions"] == 1
    by_task: dict[str, list] = {}
    for rec in journal:
        if rec["status"] == int(Status.UNGRADED):
            continue
        if rec["status"] == int(Status.VALID):
            assert rec["benchmark"]["benchmark"] == ("mlebench" if rec["task_id"] == "mb-toxic-tags"
                                                     else "mledojo")  # fmt: skip
        verdict = rec.get("benchmark") or {"medal": None, "above_median": False,
                                           "position_score": 0.0}  # fmt: skip
        by_task.setdefault(rec["task_id"], []).append(verdict)
    mb = by_task["mb-toxic-tags"]
    assert bench["any_medal_pct"] == pytest.approx(100 * np.mean([v["medal"] is not None
                                                                  for v in mb]))  # fmt: skip
    assert bench["above_median_pct"] == pytest.approx(100 * np.mean([v["above_median"]
                                                                     for v in mb]))  # fmt: skip
    positions = [np.mean([v["position_score"] for v in vs]) for vs in by_task.values()]
    assert bench["position_score"] == pytest.approx(np.mean(positions))
    assert ev["heldout_reward"] is not None


def n_better(board, score: float, higher: bool) -> int:
    """How many of a leaderboard's scores are strictly better than ``score``."""
    board = np.asarray(board)
    return int(np.sum(board > score if higher else board < score))


class _RefusingPool:
    def submit(self, *args, **kwargs):
        raise AssertionError("a journalled held-out execution was executed again")


@pytest.mark.real
def test_execute_scripts_reports_honest_solutions_and_reuses_the_journal(tmp_path):
    """Each competition's honest solution and one malformed script (k = 2) through the
    evaluation's executor on the real pool: the figures match the verdicts worked out here
    from each solution's score (run outside the sandbox) and the hand-made leaderboards, and a
    second evaluation at the same step takes the same verdicts from the journal."""
    import os

    from tests.support.competition_fixtures import BOARDS, MLEBENCH, SOLUTIONS, import_both
    from wmrl.autoresearch.anchors import open_journal
    from wmrl.autoresearch.env.competitions.report import VERDICT_FIELDS
    from wmrl.autoresearch.env.grader import grade_submission
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.env.task import load_suite
    from wmrl.autoresearch.evaluation import execute_scripts, heldout_summary

    tasks = load_suite(import_both(tmp_path / "competitions"))
    scripts = [s for t in tasks for s in (SOLUTIONS[t.id], "def broken(:\n")]
    row_tasks = [t for t in tasks for _ in range(2)]
    journal = open_journal(tmp_path, "heldout")
    with SandboxPool(num_workers=2) as pool:
        out = execute_scripts(pool, journal, 0, row_tasks, scripts, kind="eval")
    bench = heldout_summary(tasks, 2, out["status"], out["reward"], out)["heldout_benchmark"]
    expected_pos, medals, above = [], [], []
    for t in tasks:  # the verdict of each honest solution, by hand
        sub = tmp_path / f"{t.id}.csv"
        env = {**os.environ, "DATA_DIR": str(t.public_dir), "SUBMISSION_PATH": str(sub)}
        subprocess.run([sys.executable, "-c", SOLUTIONS[t.id]], env=env, check=True)
        score = grade_submission(t, sub).score
        higher = t.id in ("mb-toxic-tags", "md-flower-kind")
        boards = BOARDS[t.id]
        pos = np.mean([(len(b) - n_better(b, score, higher)) / len(b) for b in boards.values()])
        expected_pos.append(pos / 2)  # the malformed script scores 0
        if t.id in MLEBENCH:
            board = np.asarray(boards["leaderboard"])
            bronze = board[19]  # 50 teams: bronze at position 20
            reaches = round(score, 5) >= bronze if higher else round(score, 5) <= bronze
            medals.append(0.5 * reaches)
            median = np.median(board)
            above.append(0.5 * (score > median if higher else score < median))
    assert bench["position_score"] == pytest.approx(np.mean(expected_pos))
    assert bench["any_medal_pct"] == pytest.approx(100 * np.mean(medals))
    assert bench["above_median_pct"] == pytest.approx(100 * np.mean(above))
    assert bench["any_medal_pct"] > 0 and bench["position_score"] > 0  # not a vacuous check
    again = execute_scripts(_RefusingPool(), journal, 0, row_tasks, scripts, kind="eval")
    journal.close()
    for name in ("status", "reward", *VERDICT_FIELDS):
        np.testing.assert_array_equal(again[name], out[name])
