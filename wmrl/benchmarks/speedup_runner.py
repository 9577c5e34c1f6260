"""The speedup benchmark's runner: the shared stages once, then every mode in a fresh process.

It asks the pipeline whether a stage or a mode is done (`wmrl.autoresearch.stages.stages_done`,
`wmrl.autoresearch.experiment.is_finished`) instead of knowing their folders. See
`wmrl.benchmarks.speedup` for the command and what the directories hold.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

from wmrl.core.correct import MODE_SPECS
from wmrl.jsonl import read_jsonl

# By default `real`, `wmrl` and the control `static_anchors` (docs/method.md 3.9: the same anchors
# and static check, a WM that knows only the average): what `wmrl` gains over the control is
# what the world model contributes.
MODES = ("real", "wmrl", "static_anchors")
ABLATIONS = ("wm_only", "debias_only", "denoise_only")
# real, wm_only, debias_only, denoise_only, wmrl, static_anchors, permuted_wm (the control that
# keeps the WM's spread without its information: `--modes=real,wmrl,static_anchors,permuted_wm`)
ALL_MODES = tuple(MODE_SPECS)
UNLIMITED_STEPS = 10**9  # the step limit under a wall-clock budget (the budget ends the run)
# Under a budget, held-out evaluations at EVAL_POINTS training wall-clock points spaced
# geometrically from budget / EVAL_SPAN to the budget (a constant ~1.37x apart): time ratios
# get the same relative resolution wherever the target is reached. (Evenly spaced points,
# budget / 8 apart, capped a measurable ratio at t_real / (budget / 8): about 2x when real
# reached its target at its second point.)
EVAL_POINTS = 12
EVAL_SPAN = 32.0


def geometric_points(budget_s: float, n: int = EVAL_POINTS, span: float = EVAL_SPAN):
    """`n` wall-clock points from `budget_s / span` to `budget_s`, each the previous times
    `span ** (1 / (n - 1))`."""
    return tuple(budget_s * span ** (i / (n - 1) - 1.0) for i in range(n))


# A mode under cost-aware routing (docs/method.md 3.11): `<mode>+cap` (the cap at
# DEFAULT_CAP_S), `<mode>+cap=S` (S seconds) or `<mode>+capq=Q` (the adaptive cap, quantile Q
# of recent anchor execution times); e.g. --modes=real,wmrl,static_anchors,real+cap,wmrl+cap,
# static_anchors+cap. The base mode's runs are today's, without the cap.
CAP_SUFFIX = "+cap"
DEFAULT_CAP_S = 2.0


def split_mode(name: str) -> tuple[str, dict]:
    """(the base mode, the config fields its cap sets: {} without one) of a benchmark mode
    name; ValueError for a cap that does not parse."""
    base, sep, cap = name.partition(CAP_SUFFIX)
    if not sep:
        return name, {}
    fields = {"routing": "cost", "correction.cheap_limit_s": 0.0, "correction.cheap_quantile": 0.0}
    if cap == "":
        fields["correction.cheap_limit_s"] = DEFAULT_CAP_S
    elif cap.startswith("="):
        fields["correction.cheap_limit_s"] = float(cap[1:])
    elif cap.startswith("q="):
        fields["correction.cheap_quantile"] = float(cap[2:])
    else:
        raise ValueError(f"{name!r}: a capped mode is <mode>+cap, <mode>+cap=S or <mode>+capq=Q")
    return base, fields


def known_mode(name: str) -> bool:
    """Whether `name` is a mode of the table, with or without a cap that parses."""
    try:
        return split_mode(name)[0] in ALL_MODES
    except ValueError:
        return False


def modes_for(ablations: bool) -> tuple[str, ...]:
    return ALL_MODES if ablations else MODES


def shared_config(config, workdir: str | os.PathLike, budget_s: float | None = None,
                  steps: int | None = None, eval_samples: int | None = None):  # fmt: skip
    """A copy of `config` with the shared data/init dirs under `workdir`/shared (unless the
    config names its own), the wall-clock budget, the step limit (see the module doc) and the
    scripts per held-out task in each evaluation (`eval_samples`; None keeps the config's)."""
    c = config.copy_and_resolve_references()
    shared = Path(workdir) / "shared"
    if not c.data_dir:
        c.data_dir = str(shared / "data")
    if not c.init_dir:
        c.init_dir = str(shared / "init")
    if budget_s:
        c.rl.max_wall_time_s = float(budget_s)
        c.rl.steps = UNLIMITED_STEPS
        # Evaluate every mode at the same wall-clock points (a step-count cadence would give
        # the faster mode more, and the slower one coarser, evaluations).
        if not c.rl.eval_every_s and not c.rl.eval_at_s:
            c.rl.eval_at_s = geometric_points(float(budget_s))
        c.rl.eval_every = UNLIMITED_STEPS
    if steps:
        c.rl.steps = int(steps)
    if eval_samples:
        c.rl.eval_samples = int(eval_samples)
    return c


def mode_config(config, mode: str):
    """The shared config with `mode` set (the only field that differs between modes; a
    capped mode, `split_mode`, also sets cost-aware routing and its cap)."""
    from wmrl.experiment.config import set_fields

    c = config.copy_and_resolve_references()
    base, cap = split_mode(mode)
    c.mode = base
    return set_fields(c, cap)


def _redirect_output(log_path: str | None) -> None:
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


def _stages_child(config, log_path, progress) -> None:
    """The stages of `wmrl.autoresearch.experiment.run` before RL, into the shared dirs: the data
    stage, the warm start and the WM pretraining (built exactly as `run` builds them, so that
    every mode's `run` finds them done and loads them)."""
    _redirect_output(log_path)
    from wmrl.autoresearch.experiment import prepare_stages, quiet_orbax

    quiet_orbax()
    prepare_stages(config, config.init_dir, progress)  # data_dir and init_dir are set


def _mode_child(config, workdir, log_path, progress) -> None:
    _redirect_output(log_path)
    from wmrl.autoresearch.experiment import run

    run(config, workdir, progress=progress)


def _child_main(parent_pid: int, target, args) -> None:
    """A benchmark child: on Linux it is sent SIGTERM when the benchmark's process dies
    (killed, or a terminal closed), instead of training on alone into a directory the next
    command may reuse."""
    if sys.platform == "linux":
        import signal

        from wmrl.autoresearch.env import linux

        linux.prctl(linux.PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before the call
            raise SystemExit("the benchmark's process is gone")
    target(*args)


def _in_fresh_process(target, args, what: str, log_path: str | None) -> float:
    """Run `target(*args)` in a spawned process (no inherited JIT caches); returns seconds."""
    t0 = time.monotonic()
    p = multiprocessing.get_context("spawn").Process(
        target=_child_main, args=(os.getpid(), target, args)
    )
    p.start()
    try:
        p.join()
    except KeyboardInterrupt:  # e.g. a notebook's interrupt reaches the parent only
        p.terminate()
        p.join()
        raise
    if p.exitcode != 0:
        tail = ""
        if log_path and Path(log_path).exists():
            tail = "\n" + "\n".join(Path(log_path).read_text().splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit code {p.exitcode}){tail}")
    return time.monotonic() - t0


def seed_config(config, index: int):
    """The config of the benchmark's `index`-th seed: the first is `config` itself, the
    others set `rl.seed` to the first's RL seed + `index`. Only the RL run's seed differs
    (policy sampling, task order, routing, executions); `seed`, which the shared stages
    depend on, stays, so every seed starts from the same data, warm start and WM."""
    from wmrl.autoresearch.config import rl_seed

    c = config.copy_and_resolve_references()
    if index:
        c.rl.seed = rl_seed(config) + index
    return c


def seeds_of(config, seeds: int) -> list[int]:
    """The RL seeds (`wmrl.autoresearch.config.rl_seed`) of the benchmark's `seeds` seeds."""
    from wmrl.autoresearch.config import rl_seed

    return [rl_seed(seed_config(config, i)) for i in range(seeds)]


def run_dir(workdir: str | os.PathLike, mode: str, index: int = 0) -> Path:
    """Where (mode, seed index) runs: DIR/<mode> for the first seed (the layout of a one-seed
    benchmark, so its runs are reused by a longer one), DIR/<mode>-seed<index> after."""
    return Path(workdir) / (mode if index == 0 else f"{mode}-seed{index}")


def run_modes(config, workdir: str | os.PathLike, modes=MODES, progress: bool = True,
              log_to_files: bool = False, seeds: int = 1, skip=()) -> dict:  # fmt: skip
    """Run the shared stages (if a run still has to run) and every (mode, seed) run not yet
    finished, seed by seed, except the seed indices in `skip` (the seeds an earlier
    benchmark's JSON supplies); returns `{"stages_s", "modes_s": {run dir name: s}, "reused":
    [run dir names]}`.

    `config` is the shared config (`shared_config`); seed i runs `seed_config(config, i)` in
    `run_dir(workdir, mode, i)`. With `log_to_files`, each process writes its output to
    DIR/shared/stages.log or <run dir>/run.log instead of the terminal."""
    from wmrl.autoresearch.experiment import check_resumable, is_finished
    from wmrl.autoresearch.stages import stages_done

    workdir = Path(workdir)
    runs = [(run_dir(workdir, m, i), mode_config(seed_config(config, i), m))
            for i in range(seeds) if i not in skip for m in modes]  # fmt: skip
    todo = [(d, c) for d, c in runs if not is_finished(d)]
    for d, c in runs:  # fail before anything runs
        check_resumable(c, d)
    out = {"stages_s": None, "modes_s": {},
           "reused": [d.name for d, _ in runs if all(d != t for t, _ in todo)]}  # fmt: skip
    for name in out["reused"]:
        print(f"{name}: reusing the finished run in {workdir / name}", flush=True)
    if not todo:
        return out
    if not stages_done(config, config.init_dir):
        (workdir / "shared").mkdir(parents=True, exist_ok=True)
        log = str(workdir / "shared" / "stages.log") if log_to_files else None
        print(f"shared stages -> {config.data_dir}, {config.init_dir}", flush=True)
        out["stages_s"] = _in_fresh_process(_stages_child, (config, log, progress), "stages", log)
    for d, c in todo:
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(c.to_json_best_effort(indent=2) + "\n")
        log = str(d / "run.log") if log_to_files else None
        print(f"{d.name}: running in {d}", flush=True)
        out["modes_s"][d.name] = _in_fresh_process(
            _mode_child, (c, str(d), log, progress), d.name, log
        )
    return out


def load_runs(workdir: str | os.PathLike, modes=MODES, index: int = 0) -> dict:
    """`{mode: {"summary", "steps", "pairs"}}` from the finished runs of seed `index`."""
    runs = {}
    for m in modes:
        d = run_dir(workdir, m, index)
        runs[m] = {
            "summary": json.loads((d / "summary.json").read_text()),
            "steps": [r for r in read_jsonl(d / "metrics.jsonl") if r.get("kind") == "step"],
            "pairs": read_jsonl(d / "pairs.jsonl"),
        }
    return runs
