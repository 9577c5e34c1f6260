"""Finished benchmark runs written by hand (summary.json, metrics.jsonl, pairs.jsonl per mode),
so the speedup CLI and the ablations notebook can be checked without running RL."""

import json
from pathlib import Path


def ev(t, reward, execs=0, step=0):
    return {"step": step, "wall_time_s": t, "real_executions": execs, "heldout_reward": reward}


def write_finished_run(d: Path, mode, curve, walls, executes, anchor_fraction, pairs=()):
    d.mkdir(parents=True)
    summary = {
        "mode": mode, "steps": len(walls), "warmstart_heldout_reward": curve[0]["heldout_reward"],
        "final_heldout_reward": curve[-1]["heldout_reward"],
        "best_heldout_reward": max(e["heldout_reward"] for e in curve),
        "wall_time_s": walls[-1], "real_executions": curve[-1]["real_executions"],
        "wm_calls": 0 if mode == "real" else 8 * len(walls), "heldout_curve": curve,
        "device": "cpu",
    }  # fmt: skip
    (d / "summary.json").write_text(json.dumps(summary))
    steps = [
        {"kind": "step", "step": i + 1, "wall_time_s": w, "execute_s": x,
         "anchor_fraction": anchor_fraction}
        for i, (w, x) in enumerate(zip(walls, executes, strict=True))
    ]  # fmt: skip
    evals = [{"kind": "eval", **e} for e in curve]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps + evals))
    (d / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))


# The anchor pairs of the hand-written WM runs (groups of 2): raw scores 0.0 .. 0.9 against a
# real reward of 0.5 (raw MAE 0.25), debiased scores all 0.45 (MAE 0.05).
PAIRS = [
    {"step": 1 + i // 2, "row": i % 2, "task_id": "t", "status": 5, "r_wm": 0.1 * i,
     "r_cal": 0.45, "r_env": 0.5, "static": False, "static_status": None}
    for i in range(10)
]  # fmt: skip


def finished_benchmark(workdir: Path, modes=("real", "wmrl"), seed_index: int = 0,
                       wmrl=None) -> None:  # fmt: skip
    """real: 4 steps of 10 s (6 s executing), evals 0.2, 0.3, 0.4 at 0, 20, 40 s;
    wmrl: 4 steps of 4 s at anchor fraction 0.25, evals 0.2, 0.45, 0.5 at 0, 8, 16 s (or the
    curve `wmrl`); any other mode: 2 steps of 5 s, evals 0.2, 0.25 at 0, 10 s. In the run
    directories of seed `seed_index` (`speedup_runner.run_dir`)."""
    from wmrl.benchmarks.speedup_runner import run_dir

    d = lambda m: run_dir(workdir, m, seed_index)
    real = [ev(0, 0.2, 0, 0), ev(20, 0.3, 16, 2), ev(40, 0.4, 32, 4)]
    wmrl = wmrl or [ev(0, 0.2, 0, 0), ev(8, 0.45, 4, 2), ev(16, 0.5, 8, 4)]
    write_finished_run(d("real"), "real", real, [10, 20, 30, 40], [6] * 4, 1.0)
    write_finished_run(d("wmrl"), "wmrl", wmrl, [4, 8, 12, 16], [1] * 4, 0.25, PAIRS)
    for m in modes:
        if m not in ("real", "wmrl"):
            curve = [ev(0, 0.2, 0, 0), ev(10, 0.25, 4, 2)]
            write_finished_run(d(m), m, curve, [5, 10], [1, 1], 0.25, PAIRS)


def child_writes(path: str, log_path, fail: bool) -> None:
    """A stand-in for a stage or mode process: prints, writes `path`, optionally fails."""
    from wmrl.benchmarks.speedup_runner import _redirect_output

    _redirect_output(log_path)
    print("child output", flush=True)
    Path(path).write_text(str(__import__("os").getpid()))
    if fail:
        raise SystemExit(3)


def child_sleeps(path: str) -> None:
    """A stand-in for a mode process that outlives a killed benchmark unless it is stopped:
    writes its pid to `path`, then sleeps."""
    import time

    Path(path).write_text(str(__import__("os").getpid()))
    time.sleep(120)
