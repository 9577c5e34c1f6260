"""Evaluation in the benchmarks' own terms: per execution, per held-out evaluation, over seeds.

    python -m wmrl.autoresearch.env.competitions.report --runs=RUN1,RUN2,RUN3 \\
        [--step=-1] [--min_seeds=3] [--out=report.json]

Three layers:

* ``verdict_row``: one execution's verdict as numbers (medal rank, above the median,
  position score), NaN where a term does not apply: not a competition, an UNGRADED execution
  (masked out, as its reward is), or a term the benchmark does not have (MLE-Dojo awards no
  medal). A graded execution that is not VALID has no score: no medal, not above the
  median, position score 0 (``leaderboard``).
* ``heldout_benchmark``: one held-out evaluation (k scripts per competition) in the
  benchmarks' terms, each competition's rate the mean over its graded scripts (the
  expected outcome of one submission), then the mean over competitions: any-medal % and
  above-median % over the MLE-bench competitions, the position score over every
  competition (MLE-Dojo's average over its two leaderboards; MLE-bench's on its one).
  ``Trainer.evaluate`` adds it to every evaluation record as ``heldout_benchmark``.
* ``seed_report``: several runs (seeds) of the same evaluation, as MLE-bench reports them:
  each figure's mean over seeds with one standard error (``sd(ddof=1) / sqrt(seeds)``),
  beside our held-out reward the same way. The CLI reads each run's last (or ``--step``)
  evaluation record from its ``metrics.jsonl`` and refuses fewer than ``--min_seeds`` runs.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

MEDAL_RANK = {None: 0.0, "bronze": 1.0, "silver": 2.0, "gold": 3.0}
VERDICT_FIELDS = ("medal", "above_median", "position_score")
NAN3 = (math.nan, math.nan, math.nan)


def verdict_row(task, status: int, benchmark: dict | None) -> tuple[float, float, float]:
    """(medal rank 0-3, above median 0/1, position score) of one execution (module
    docstring); ``status`` the grader's, ``benchmark`` its ``Grade.benchmark``."""
    from wmrl.autoresearch.env.grader import Status

    spec = getattr(task, "competition", None)
    if spec is None or int(status) == int(Status.UNGRADED):
        return NAN3
    mlebench = spec["benchmark"] == "mlebench"
    if benchmark is None:  # graded, not VALID: no score
        return (0.0, 0.0, 0.0) if mlebench else (math.nan, math.nan, 0.0)
    if mlebench:
        return (MEDAL_RANK[benchmark["medal"]], float(benchmark["above_median"]),
                float(benchmark["position_score"]))  # fmt: skip
    return (math.nan, math.nan, float(benchmark["position_score"]))


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else None


def heldout_benchmark(tasks: list, k: int, verdicts: dict[str, np.ndarray]) -> dict | None:
    """One evaluation's benchmark figures (module docstring); ``verdicts`` holds one
    ``[T*k]`` array per ``VERDICT_FIELDS`` name, task t's scripts at ``[t*k, (t+1)*k)``.
    None when no held-out task is a competition."""
    per_task = {}
    for i, t in enumerate(tasks):
        if getattr(t, "competition", None) is None:
            continue
        rows = slice(i * k, (i + 1) * k)
        medal = verdicts["medal"][rows]
        graded = ~np.isnan(medal)
        entry = {
            "benchmark": t.competition["benchmark"],
            "position_score": _mean(verdicts["position_score"][rows]),
        }
        if t.competition["benchmark"] == "mlebench":
            entry["any_medal"] = float(np.mean(medal[graded] > 0)) if graded.any() else None
            entry["gold"] = float(np.mean(medal[graded] == 3)) if graded.any() else None
            entry["above_median"] = _mean(verdicts["above_median"][rows])
        per_task[t.id] = entry
    if not per_task:
        return None
    mle = [e for e in per_task.values() if e["benchmark"] == "mlebench"]

    def pct(key: str) -> float | None:
        m = _mean(e[key] for e in mle)
        return None if m is None else 100.0 * m

    return {
        "competitions": len(per_task),
        "mlebench_competitions": len(mle),
        "any_medal_pct": pct("any_medal"),
        "gold_pct": pct("gold"),
        "above_median_pct": pct("above_median"),
        "position_score": _mean(e["position_score"] for e in per_task.values()),
        "per_task": per_task,
    }


REPORTED = ("any_medal_pct", "gold_pct", "above_median_pct", "position_score")


def mean_se(values: list[float | None]) -> dict:
    """Mean over seeds with one standard error (``sd(ddof=1) / sqrt(n)``; None with fewer
    than two seeds), over the seeds that have the figure."""
    v = np.asarray([x for x in values if x is not None], float)
    if v.size == 0:
        return {"mean": None, "se": None, "seeds": 0}
    se = float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else None
    return {"mean": float(np.mean(v)), "se": se, "seeds": int(v.size)}


def seed_report(evals: list[dict]) -> dict:
    """The benchmark figures and the held-out reward over seeds: ``evals`` holds one
    evaluation record (``Trainer.evaluate``'s) per seed, all on the same competitions."""
    if not evals:
        raise ValueError("seed_report needs at least one evaluation record")
    sets = [sorted((e.get("heldout_benchmark") or {}).get("per_task", {})) for e in evals]
    if any(s != sets[0] for s in sets):
        raise ValueError(f"the runs were evaluated on different competitions: {sets}")
    bench = [e.get("heldout_benchmark") or {} for e in evals]
    out = {"seeds": len(evals), "competitions": sets[0]}
    for key in REPORTED:
        out[key] = {**mean_se([b.get(key) for b in bench]), "per_seed": [b.get(key) for b in bench]}
    rewards = [e.get("heldout_reward") for e in evals]
    out["heldout_reward"] = {**mean_se(rewards), "per_seed": rewards}
    return out


def format_report(report: dict) -> str:
    """A markdown table of ``seed_report``'s figures: mean ± SE over the seeds."""
    names = {
        "any_medal_pct": "any medal (%)", "gold_pct": "gold (%)",
        "above_median_pct": "above median (%)", "position_score": "position score",
        "heldout_reward": "held-out reward",
    }  # fmt: skip
    lines = [f"{report['seeds']} seeds, {len(report['competitions'])} competitions", "",
             "| figure | mean ± SE |", "|---|---|"]  # fmt: skip
    for key, name in names.items():
        m = report[key]
        if m["mean"] is None:
            cell = "n/a"
        else:
            cell = f"{m['mean']:.3f}" + (f" ± {m['se']:.3f}" if m["se"] is not None else "")
        lines.append(f"| {name} | {cell} |")
    return "\n".join(lines)


def eval_record(run: Path, step: int = -1) -> dict:
    """A run's evaluation record at ``step`` (-1: its last) from its metrics.jsonl."""
    from wmrl.jsonl import read_jsonl

    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{run}: no metrics.jsonl (not a trainer workdir?)")
    evals = [r for r in read_jsonl(path) if r.get("kind") == "eval"]
    if step != -1:
        evals = [r for r in evals if r.get("step") == step]
    if not evals:
        at = "" if step == -1 else f" at step {step}"
        raise ValueError(f"{run}: no held-out evaluation{at} in {path}")
    return evals[-1]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m wmrl.autoresearch.env.competitions.report",
        description="Held-out evaluation over seeds in MLE-bench's and MLE-Dojo's terms.",
    )
    parser.add_argument("--runs", required=True, help="comma-separated trainer workdirs")
    parser.add_argument("--step", type=int, default=-1, help="the evaluation's step (-1: last)")
    parser.add_argument("--min_seeds", type=int, default=3, help="refuse fewer runs")
    parser.add_argument("--out", default="", help="also write the report here as JSON")
    args = parser.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    if len(runs) < args.min_seeds:
        print(f"report: {len(runs)} run(s) given; the benchmarks report over at least "
              f"{args.min_seeds} seeds (--min_seeds)", file=sys.stderr)  # fmt: skip
        return 2
    try:
        report = seed_report([eval_record(Path(r), args.step) for r in runs])
    except ValueError as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    report["runs"] = runs
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    print(format_report(report))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
