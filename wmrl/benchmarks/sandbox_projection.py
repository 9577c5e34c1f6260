"""On paper: the per-step speedup of `wmrl` over `real` when the sandboxes have nodes of their own.

    python -m wmrl.benchmarks.sandbox_projection --executions=DATA/trajectories/executions.jsonl \\
        [--slots=8,32,128] [--learner_s=3.1] [--overhead_s=0.06] [--out=FILE.json]

A simulation, not a timed run. Its inputs are measured: the per-script costs are the
``runtime_s`` of executed scripts (the data stage's ``executions.jsonl``: the tiny suite's
authored scripts, their mistakes included, executed in the sandbox), capped at the time limit
(``--time_limit_s``) plus a per-execution overhead (``--overhead_s``: the local pool's plus what
Ray adds, from ``python -m wmrl.benchmarks.sandbox --executor=ray``); the learner's seconds per
step (``--learner_s``, sampling + reference log-probs + update) come from a measured run.

Per step, with S slots on nodes of their own (so execution never takes the learner's cores):
  * ``real`` executes all N scripts and waits for them: ``learner + makespan(N on S)``;
  * ``wmrl`` (``rl.anchor_lag=1``) executes the A anchor scripts while the next step computes:
    ``max(learner, makespan(A on S))`` in the steady state.
The makespan is greedy list scheduling in submission order (each script to the first free slot,
as the executor dispatches), over ``--trials`` random draws of the measured costs.
Two batch settings: the tiny config's (N=32, A=8 at every S), and a batch that grows with the
slots (N=4S, A=S; the learner's time scaled by N/32, i.e. one accelerator doing more work).
"""

from __future__ import annotations

import heapq
import json
from pathlib import Path

import numpy as np
from absl import app, flags


def makespan(costs: np.ndarray, slots: int) -> float:
    free = [0.0] * min(slots, len(costs))
    for c in costs:
        heapq.heappush(free, heapq.heappop(free) + float(c))
    return max(free) if free else 0.0


def project(
    costs: np.ndarray,
    slots: int,
    n: int,
    anchors: int,
    learner_s: float,
    trials: int,
    seed: int = 0,
) -> dict:
    rng = np.random.default_rng(seed)
    real, wmrl = [], []
    for _ in range(trials):
        real.append(learner_s + makespan(rng.choice(costs, n), slots))
        wmrl.append(max(learner_s, makespan(rng.choice(costs, anchors), slots)))
    real, wmrl = np.array(real), np.array(wmrl)
    return {
        "slots": slots,
        "scripts_per_step": n,
        "anchors_per_step": anchors,
        "learner_s": learner_s,
        "real_step_s": float(real.mean()),
        "wmrl_step_s": float(wmrl.mean()),
        "speedup": float(real.mean() / wmrl.mean()),
        "amdahl_bound_colocated": n / anchors,
    }


def run(
    executions: str,
    slots: list[int],
    learner_s: float,
    overhead_s: float,
    time_limit_s: float,
    trials: int,
) -> dict:
    recs = [json.loads(line) for line in Path(executions).read_text().splitlines() if line]
    costs = np.minimum([r["runtime_s"] for r in recs], time_limit_s) + overhead_s
    out = {
        "executions": len(costs),
        "cost_mean_s": float(costs.mean()),
        "cost_median_s": float(np.median(costs)),
        "cost_p95_s": float(np.quantile(costs, 0.95)),
        "cost_max_s": float(costs.max()),
        "overhead_s": overhead_s,
        "time_limit_s": time_limit_s,
        "tiny_batch": [project(costs, s, 32, 8, learner_s, trials) for s in slots],
        "batch_grows_with_slots": [
            project(costs, s, 4 * s, s, learner_s * 4 * s / 32, trials) for s in slots
        ],
    }
    return out


def table(res: dict) -> str:
    lines = [
        f"per-script cost (n={res['executions']}): mean {res['cost_mean_s']:.2f} s, median "
        f"{res['cost_median_s']:.2f} s, p95 {res['cost_p95_s']:.2f} s, "
        f"max {res['cost_max_s']:.2f} s",
        "| batch | slots | N / A | learner s | real s/step | wmrl s/step | speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("tiny_batch", "batch_grows_with_slots"):
        for r in res[name]:
            lines.append(
                f"| {name} | {r['slots']} | {r['scripts_per_step']} / {r['anchors_per_step']} | "
                f"{r['learner_s']:.1f} | {r['real_step_s']:.1f} | {r['wmrl_step_s']:.1f} | "
                f"{r['speedup']:.2f}x |"
            )
    return "\n".join(lines)


FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_string("executions", None, "executions.jsonl of a data stage (measured costs)")
    flags.DEFINE_list("slots", ["2", "8", "32", "128"], "sandbox slots (2: today's check)")
    flags.DEFINE_float("learner_s", 3.1, "measured learner seconds per step at N=32")
    flags.DEFINE_float("overhead_s", 0.06, "per-execution overhead (local pool + Ray)")
    flags.DEFINE_float("time_limit_s", 20.0, "suite.time_limit_s of the runs")
    flags.DEFINE_integer("trials", 2000, "random draws per setting")
    flags.DEFINE_string("out", None, "write the JSON here")


def main(argv) -> None:
    del argv
    if not FLAGS.executions:
        raise app.UsageError("--executions is required")
    res = run(
        FLAGS.executions,
        [int(s) for s in FLAGS.slots],
        FLAGS.learner_s,
        FLAGS.overhead_s,
        FLAGS.time_limit_s,
        FLAGS.trials,
    )
    print(table(res))
    if FLAGS.out:
        Path(FLAGS.out).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
