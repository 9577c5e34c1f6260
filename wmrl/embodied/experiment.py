"""The embodied pipeline behind `python -m wmrl.main --config=configs/embodied_push.py`.

`run(config, workdir)` does, resumably: expert demos -> behaviour cloning -> world-model
pretraining (skipped by mode `real`, which needs no WM) -> GRPO with held-out evaluations by
real rollouts -> summary and plots. Importable from a notebook (`colabs/embodied.ipynb`).

Files in the workdir (a local folder):
    config.json     the resolved config (a resume under another config is refused)
    metrics.jsonl   one object per RL step (`"kind": "step"`) and per evaluation ("eval"),
                    each with the step that wrote it (`written_at_step`: a resume cuts what
                    the steps after its checkpoint wrote, `wmrl.jsonl.StepLog`); a run's
                    records written under older key names are read under today's
                    (`read_metrics`)
    summary.json    final results (its presence marks the run finished)
    checkpoints/    Orbax run checkpoints (`wmrl.experiment.checkpoint`), the newest two:
                    <n>/ holds step n's RL state pytree, the WM's replay and the meta (step,
                    wall clock); a corrupt one is moved to checkpoints_corrupt/ and the one
                    before it used. Legacy step_<n>.npz + replay_<n>.npz + meta_<n>.json
                    checkpoints (`wmrl.embodied.legacy`) resume too.
    plots/          heldout_success.png, wm_diagnostics.png
    init/           the stages (unless config.init_dir points elsewhere)

Cost: `real_executions` counts the RL run's simulator episodes (an embodied execution is one
episode in the simulator: the anchors', or every episode in mode `real`); evaluation
episodes and the stages' episodes (expert demos, the WM's pretraining rollouts of the BC
policy) are reported separately. `wall_time_s` counts RL steps only. With
`env.real_episode_cost_s` > 0, `modelled_robot_time_s` adds that declared latency per real
execution: a model of a robot, not a measurement.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np
import optax

from wmrl import storage
from wmrl.embodied import legacy, rl, rollout, stages
from wmrl.embodied import world_model as wmodel
from wmrl.embodied.config import HISTORY, EmbodiedConfig, validate_embodied_config
from wmrl.experiment import config as xconfig
from wmrl.experiment import summary as summaries
from wmrl.experiment.checkpoint import RunCheckpointer, quiet_orbax
from wmrl.experiment.loop import run_loop
from wmrl.experiment.renamed import upgrade_keys
from wmrl.experiment.sections import rl_seed
from wmrl.jsonl import StepLog, read_jsonl


def check_resumable(config, workdir, ignore: tuple[str, ...] = ()) -> None:
    """A workdir holding a run with another config is refused, naming the fields (those in
    `ignore`, flat names like `init_dir`, are not compared; `wmrl.embodied.config.HISTORY`:
    what fields saved runs predate)."""
    xconfig.check_resumable(HISTORY, config, workdir, ignore, schema=EmbodiedConfig)


def evaluate(trainer: rl.Trainer, params, starts, seed: int) -> dict:
    """Held-out success by real rollouts (fixed starts and key: every evaluation alike)."""
    eps = trainer.execute(params, starts, jax.random.PRNGKey(seed + 99))
    # in float64: 135 of 300 is 0.45, which a float32 mean (0.44999998...) falls short of
    p = float(np.mean(eps.success, dtype=np.float64))
    return {
        "heldout_success": p,
        "heldout_success_se": float(np.sqrt(p * (1 - p) / len(eps))),
        "eval_episodes": len(eps),
    }


def read_metrics(workdir) -> list[dict]:
    """A run's metrics.jsonl records, those written under older key names read under today's
    (`wmrl.experiment.renamed.upgrade_keys`)."""
    return [upgrade_keys(r) for r in read_jsonl(Path(workdir) / "metrics.jsonl")]


CHECKPOINTS_KEPT = 2  # the newest two


def restore(ckpt: RunCheckpointer, template) -> tuple[int, dict, dict, float] | None:
    """(step, RL state, replay, wall clock) of the newest checkpoint that restores into
    `template`: an Orbax one, else a legacy `.npz` one (`wmrl.embodied.legacy`: read once, the
    run checkpoints with Orbax from then on); None without any."""
    out = ckpt.restore_latest(template)
    if out is not None:
        return out.step, out.state, out.host or {}, out.meta["wall_time_s"]
    steps = legacy.checkpoint_steps(ckpt.directory)
    if not steps:
        return None
    state, replay, meta = legacy.read_checkpoint(ckpt.directory, steps[-1], template)
    print(
        f"resuming from the legacy .npz checkpoint of step {steps[-1]} in {ckpt.directory} "
        "(written before embodied checkpoints were Orbax's); later checkpoints are Orbax "
        "step folders beside it, the .npz files are left as they were",
        flush=True,
    )
    return steps[-1], state, replay, meta["wall_time_s"]


@dataclasses.dataclass
class _Stages:
    """What the stages before RL produce: the demos', BC's and WM pretraining's reports, the
    WM's pretraining data (None in `real`) and the seconds they took, the RL trainer and the
    initial RL state it starts from."""

    demo_rep: dict
    bc_rep: dict
    wm_rep: dict | None
    wm_data: dict | None
    stages_s: float
    trainer: rl.Trainer
    template: dict


def prepare(config, init: Path, spec, pool, train_tasks) -> _Stages:
    """The stages (expert demos, behaviour cloning, WM pretraining; each loaded when done
    with this config) and the RL trainer on their outputs, sampling `train_tasks`."""
    t_stages = time.monotonic()
    demos, demo_rep = stages.demos_stage(config, init / "demos", pool)
    graphdef, bc_params, bc_rep = stages.bc_stage(config, init / "bc", demos)
    st = rl.statics_from_config(config)
    if st.uses_wm:
        wm_params, wm_data, wm_rep = stages.wm_stage(
            config, init / "wm", pool, demos, graphdef, bc_params
        )
    else:  # `real` needs no world model (and spends no real episodes on its data)
        wm_params = wmodel.init_wm(stages.wm_spec(config), config.seed + 7)
        wm_data, wm_rep = None, None
    stages_s = time.monotonic() - t_stages

    policy_tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(config.rl.learning_rate))
    wm_tx = optax.adam(config.wm.online_learning_rate)
    trainer = rl.Trainer(
        st=st,
        graphdef=graphdef,
        ref_params=bc_params,
        pool=pool,
        train_tasks=train_tasks,
        seed=config.seed * 1000 + rl_seed(config),
        policy_tx=policy_tx,
        wm_tx=wm_tx,
        wm_online_steps=config.wm.online_steps,
        wm_batch=(
            config.wm.batch_transitions,
            config.wm.batch_episodes,
            config.wm.unroll,
            stages.value_horizon(config),
        ),
        replay_size=config.wm.replay_size,
        wm_symmetries=stages.wm_symmetries(config, spec.velocities()),
    )
    template = rl.init_rl_state(st, bc_params, wm_params, policy_tx, wm_tx)
    return _Stages(demo_rep, bc_rep, wm_rep, wm_data, stages_s, trainer, template)


@dataclasses.dataclass
class _RunState:
    """The RL state pytree, the WM's replay of real episodes, training wall-clock so far."""

    state: dict
    replay: dict
    wall: float


class _Loop:
    """The embodied side of the run loop (`wmrl.experiment.loop`): the trainer's step, timed;
    the held-out evaluation; one Orbax checkpoint of state and replay; the step log."""

    def __init__(self, config, trainer, eval_starts, log, ckpt, progress: bool):
        self.config, self.trainer, self.eval_starts = config, trainer, eval_starts
        self.log, self.ckpt, self.progress = log, ckpt, progress  # log(name, records, step)

    def step(self, st: _RunState):
        t0 = time.monotonic()
        state, replay, m = self.trainer.step(st.state, st.replay)
        jax.block_until_ready(state["policy"])
        st = _RunState(state, replay, st.wall + time.monotonic() - t0)
        if self.progress:
            print(
                f"[{self.config.mode}] step {int(state['step'])}/{self.config.rl.steps} "
                f"real={m['real_executions']} reward={m['train_reward']:.3f} "
                f"anchors={m['real_success']:.3f}",
                flush=True,
            )
        return st, {**m, "wall_time_s": st.wall}, {}

    def position(self, st: _RunState) -> tuple[int, float]:
        return int(st.state["step"]), st.wall

    def evaluate(self, st: _RunState, trained_s: float, settle_s: float):
        t = int(st.state["step"])
        ev = evaluate(self.trainer, st.state["policy"], self.eval_starts, self.config.seed)
        if self.progress:
            print(f"[{self.config.mode}] eval step {t}: held-out {ev['heldout_success']:.3f}",
                  flush=True)  # fmt: skip
        counts = {k: int(st.state[k]) for k in ("real_executions", "wm_episodes")}
        return st, {"step": t, **counts, "wall_time_s": trained_s, **ev}

    def save(self, st: _RunState) -> None:
        t = int(st.state["step"])
        self.ckpt.save(t, st.state, {"step": t, "wall_time_s": st.wall}, host=st.replay)


def run(config, workdir, progress: bool = False, write_outputs: bool = True) -> dict:
    """Run (or resume) the whole pipeline; returns the summary."""
    validate_embodied_config(config)
    quiet_orbax()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    init = Path(config.init_dir) if config.init_dir else workdir / "init"
    spec = stages.env_spec(config)
    pool = rollout.EnvPool(spec)
    train_tasks, held_tasks = stages.tasks_of(config)
    s = prepare(config, init, spec, pool, train_tasks)
    eval_starts = rollout.sample_starts(
        np.random.default_rng([config.seed, 999]), held_tasks, config.rl.eval_episodes, spec
    )
    ckpt = RunCheckpointer(workdir, CHECKPOINTS_KEPT)
    restored = restore(ckpt, s.template)
    # Records stamped with the step that wrote them and cut by it on resume, as the
    # AutoResearch run's (`wmrl.jsonl.StepLog`).
    step_log = StepLog(workdir, ("metrics.jsonl",))
    step_log.restart_at(None if restored is None else restored[0])
    records = read_metrics(workdir)

    def log(name: str, recs: list[dict], step: int) -> None:
        records.extend(step_log.write(name, recs, step))

    loop = _Loop(config, s.trainer, eval_starts, log, ckpt, progress)
    if restored is not None:
        st = _RunState(*restored[1:])
    else:
        st = _RunState(s.template, s.wm_data if s.wm_data is not None else {}, 0.0)
        st, ev = loop.evaluate(st, 0.0, 0.0)  # the warm start, step 0
        log("metrics.jsonl", [{"kind": "eval", **ev}], 0)
    st = run_loop(loop, st, config.rl.steps, config.rl.eval_every, config.rl.checkpoint_every)
    step_log.close()
    ckpt.close()
    summary = make_summary(config, records, s.demo_rep, s.bc_rep, s.wm_rep, s.stages_s)
    if write_outputs:
        from wmrl.embodied.plots import plot_run

        plot_run(workdir / "plots", records, config.target_success)
        storage.write_json(workdir / "summary.json", summary)
    return summary


# A success rate at the target counts as reaching it, also when it was stored from a float32
# mean (135 / 300 -> 0.44999998807907104 against a target of 0.45).
TARGET_TOLERANCE = 1e-6


def reached(success: float, target: float) -> bool:
    return success >= target - TARGET_TOLERANCE


def cost_to_target(evals: list[dict], target: float, key: str = "real_executions"):
    """`key` (real executions, wall-clock) at the first evaluation that reached `target`;
    None if none did."""
    return summaries.first_reaching(evals, "heldout_success", target, key, TARGET_TOLERANCE)


CURVE_KEYS = ("step", "real_executions", "wm_episodes", "wall_time_s", "heldout_success",
              "heldout_success_se")  # fmt: skip


def make_summary(config, records, demo_rep, bc_rep, wm_rep, stages_s) -> dict:
    evals = [r for r in records if r["kind"] == "eval"]
    steps = [r for r in records if r["kind"] == "step"]
    last = steps[-1] if steps else {"real_executions": 0, "wm_episodes": 0, "wall_time_s": 0.0}
    cost = float(config.env.real_episode_cost_s)
    summary = {
        "experiment": "embodied",
        "mode": config.mode,
        "observations": config.obs,
        "steps": len(steps),
        **summaries.curve_figures(evals, "heldout_success"),
        "final_heldout_success_se": evals[-1]["heldout_success_se"],
        "target_success": config.target_success,
        "real_executions": int(last["real_executions"]),
        "wm_episodes": int(last["wm_episodes"]),
        "real_executions_to_target": cost_to_target(evals, config.target_success),
        "wall_time_s": float(last["wall_time_s"]),
        "wall_time_to_target_s": cost_to_target(evals, config.target_success, "wall_time_s"),
        "stage_real_executions": {
            "expert_demos": demo_rep["real_executions"],
            "wm_pretrain_rollouts": wm_rep["real_executions"] if wm_rep else 0,
        },
        "eval_real_executions": sum(e["eval_episodes"] for e in evals),
        "real_episode_cost_s": cost,
        "heldout_curve": summaries.heldout_curve(evals, CURVE_KEYS),
        # over the steps that have them (None in `real`, NaN where undefined)
        "wm_anchor_auc_mean": summaries.finite_mean(r.get("anchor_auc") for r in steps),
        "bias_reduction_mean": summaries.finite_mean(r.get("bias_reduction") for r in steps),
        "wm_stream_corr_mean": summaries.finite_mean(r.get("wm_stream_corr") for r in steps),
        "expert_success": demo_rep["expert_success"],
        "bc": {k: v for k, v in bc_rep.items() if k != "config"},
        "wm_pretrain": {k: v for k, v in wm_rep.items() if k != "config"} if wm_rep else None,
        "stages_s": stages_s,
        "cost_note": "cost = real (simulator) episodes; wall_time_s is measured simulation "
        "time, not a robot's",
    }
    if cost > 0:
        summary["modelled_robot_time_s"] = cost * summary["real_executions"]
        summary["cost_note"] += (
            f"; modelled_robot_time_s = real_executions x the declared {cost} s per episode "
            "(env.real_episode_cost_s), a model, not a measurement"
        )
    return summary
