"""The AutoResearch pipeline behind `python -m wmrl.main --config=configs/autoresearch_tiny.py`.

`run(config, workdir)` does, resumably: data stage -> warm start -> (policy samples, with
`wm.policy_samples_per_task` > 0) -> WM pretraining -> RL with evaluations -> summary and
plots. Importable from a notebook (`colabs/ablations.ipynb`).

Files in the workdir:
    metrics.jsonl   one object per RL step (`"kind": "step"`) and per evaluation ("eval")
    pairs.jsonl     the anchor pairs (raw WM score, calibrated score, real reward, the WM's
                    P(timeout) where it has a runtime head) per step
                    (`step`: the step whose anchors they are; with rl.anchor_lag = 1 the
                    next step trains on them and writes them)
    anchors.jsonl   journal of every real anchor execution (survives preemption); with
                    several processes one per process, anchors.p{index}.jsonl
    heldout.jsonl   the same for the held-out evaluations' executions (a resumed run reuses
                    them instead of executing, and re-randomising, them again)
    summary.json    final results (its presence marks the run finished), with the WM's
                    figures on the anchors (`anchor_figures`: whole run and per quarter)
    checkpoints/    Orbax CheckpointManager steps
    tb/             TensorBoard event files
    plots/          heldout_reward.png, wm_calibration.png, corrections.png
    init/, data/    warm-start and WM-pretraining checkpoints (and the policy samples when
                    wm.policy_samples_per_task > 0), the data stage (unless
                    config.init_dir / config.data_dir point elsewhere)

The workdir may be a URL such as gs://BUCKET/PATH (`wmrl.storage`): everything above is then
written there, except the data stage, whose sandboxed subprocesses need local files: it goes
to `config.data_dir` (which must be local) or else to a local cache folder
(`wmrl.storage.local_cache_dir`). On an object store, metrics.jsonl and pairs.jsonl are
uploaded whole before every checkpoint (and at the end), the journal at the end of every RL
step (see `wmrl.jsonl.JsonlWriter` and `wmrl.autoresearch.anchors.AnchorJournal`).

A run resumes from its latest checkpoint (step k; `wmrl.autoresearch.checkpoint`). Every record of
metrics.jsonl and pairs.jsonl carries `written_at_step`, the step that wrote it, and those
written after step k are cut from both files by that one rule (`wmrl.jsonl.StepLog`), then
written again by the redone steps; TensorBoard hides its scalars of steps after k. The
journals are kept whole: a redone step reuses the executions they hold.

Wall-clock (`wall_time_s`) counts RL steps only (generation, execution, WM scoring,
training); held-out evaluations, checkpoint writes and the one-time XLA compilation of the
step (done before the clock starts, reported as `compile_s` in summary.json) are excluded,
identically in every mode, and time lost to a preemption after the last checkpoint is not
counted twice.

Several JAX processes (`wmrl.main` on a pod) run `run` together on the same global batch:
each runs its own sandbox pool and journal (`wmrl.autoresearch.anchors`), checkpoints are saved and
restored by all of them (Orbax), and only the process with `write_outputs` writes
metrics.jsonl, pairs.jsonl, tb/, plots/ and summary.json.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import jax
from etils import epath
from tqdm import tqdm

from wmrl import distributed, storage
from wmrl.autoresearch import anchor_metrics, evaluation, model_setup, stages, wm_pretraining
from wmrl.autoresearch import config as rlconfig
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch.plots import plot_run
from wmrl.experiment import config as xconfig
from wmrl.experiment import summary as summaries
from wmrl.experiment.checkpoint import quiet_orbax
from wmrl.experiment.loop import run_loop
from wmrl.jsonl import StepLog, read_jsonl

# How long the other processes wait for process 0's data stage (it executes the corpus).
DATA_STAGE_TIMEOUT_S = 6 * 3600


def data_dir(config, workdir: str | os.PathLike) -> Path:
    """The data stage's folder, always local: `config.data_dir`, else `<workdir>/data`, else
    (remote workdir) `<local cache>/data` (see `wmrl.storage.local_cache_dir`)."""
    if config.data_dir:
        storage.require_local(config.data_dir, "data_dir")
        return Path(config.data_dir)
    if storage.is_local(workdir):
        return Path(workdir) / "data"
    return storage.local_cache_dir(workdir) / "data"


def init_dir(config, workdir: str | os.PathLike) -> epath.Path:
    return epath.Path(config.init_dir) if config.init_dir else epath.Path(workdir) / "init"


def is_finished(workdir: str | os.PathLike) -> bool:
    """Whether `workdir` holds a finished run (its summary.json, written last, exists)."""
    return (epath.Path(workdir) / "summary.json").exists()


def check_resumable(config, workdir: str | os.PathLike) -> None:
    """A workdir that holds a run with a different config is refused, naming the fields
    (`wmrl.autoresearch.config.HISTORY`: what fields saved runs predate, or renamed), and so
    is one whose config.json or journals were tampered with (`check_journals`)."""
    xconfig.check_resumable(rlconfig.HISTORY, config, workdir, schema=rlconfig.AutoResearchConfig)
    check_journals(workdir)


def check_journals(workdir: str | os.PathLike) -> None:
    """Every journal a resume reuses (`anchors*.jsonl`, `heldout*.jsonl`), checked record by
    record (`anchors.read_journal`) before anything starts: a record no execution could have
    written is a `JournalError` naming the file and the line."""
    from wmrl.autoresearch.anchors import read_journal

    wd = epath.Path(workdir)
    if not wd.exists():
        return
    for kind in ("anchors", "heldout"):
        for path in sorted(wd.glob(f"{kind}*.jsonl")):
            read_journal(path)


class _Log:
    """metrics.jsonl / pairs.jsonl / TensorBoard, written by the output owner only.

    The JSONL files are a `wmrl.jsonl.StepLog`: every record carries the step that wrote it
    (`written_at_step`), and a resume cuts every file by that stamp (a step's pairs, labelled
    with the step whose anchors they are, may be written one step later). TensorBoard's
    scalars of the steps a resume redoes are hidden by the new event file (its purge step).
    Local workdir: records are appended (and TensorBoard flushed) as they come. Remote
    workdir: they are uploaded by `flush`, which `run` calls before every checkpoint, so a
    restored checkpoint never has steps whose records were lost.
    """

    NAMES = ("metrics.jsonl", "pairs.jsonl")

    def __init__(self, workdir: epath.Path, enabled: bool):
        self.enabled = enabled
        self.workdir = workdir
        self.local = storage.is_local(workdir)
        self.files = StepLog(workdir, self.NAMES)
        self.tb = None  # opened by `restart_at`, which knows the steps to hide

    def restart_at(self, step: int | None) -> None:
        """Keep the records written by steps <= step (those a restored checkpoint has seen),
        or none (step None: a fresh run); open TensorBoard past them."""
        if not self.enabled:
            return
        self.files.restart_at(step)
        purge = 0 if step is None else step + 1
        self.tb = storage.tensorboard_writer(self.workdir / "tb", purge_step=purge)

    def write(self, name: str, records: list[dict], step: int) -> None:
        """Log `records` to file `name`, written by RL step `step` (the steps done so far)."""
        if not self.enabled or not records:
            return
        self.files.write(name, records, step)
        if name == "metrics.jsonl" and self.tb is not None:
            for r in records:
                for k, v in r.items():
                    if isinstance(v, int | float) and not isinstance(v, bool) and k != "step":
                        self.tb.add_scalar(f"{r['kind']}/{k}", v, r["step"])
            if self.local:
                self.tb.flush()

    def flush(self) -> None:
        self._each("flush")

    def close(self) -> None:
        self._each("close")

    def _each(self, method: str) -> None:
        """Call `method` on the JSONL files, then on TensorBoard."""
        if self.enabled:
            getattr(self.files, method)()
            if self.tb is not None:
                getattr(self.tb, method)()


@dataclasses.dataclass
class Stages:
    """What the stages before RL produce (see `prepare_stages`)."""

    prepared: rldata.Prepared
    policy: model_setup.Model
    wm: model_setup.Model
    policy_params: dict
    wm_params: dict
    sft_report: dict
    wm_report: dict
    seconds: float
    policy_samples_report: dict | None = None  # None: wm.policy_samples_per_task = 0
    # wm.kind = "features" / "verdict": the host-side scorer the trainer uses as its WM
    # (`FeatureWM`, `VerdictWM`)
    feature_wm: object | None = None


def prepare_stages(config, workdir: str | os.PathLike, progress: bool = True) -> Stages:
    """Data stage, warm start and WM pretraining (each loaded if already done): everything
    RL starts from. The speedup benchmark calls this once for all modes."""
    t0 = time.monotonic()
    with distributed.main_process_first("data stage", timeout_s=DATA_STAGE_TIMEOUT_S):
        prepared = rldata.prepare_data(config, data_dir(config, workdir), progress=progress)
    vocab = model_setup.vocab_size(config, prepared.tokenizer)
    mesh = model_setup.make_rl_mesh(config)
    policy = model_setup.build_policy(
        config, vocab, model_setup.adam(config.rl.learning_rate), mesh, config.seed
    )
    inits = init_dir(config, workdir)
    policy_params, sft_report = stages.warm_start(
        config, prepared, policy, inits / "warmstart", progress
    )
    # The warm-started policy's own scripts, executed, for the WM pretraining (k > 0 only).
    samples, samples_report = stages.policy_samples(
        config, prepared, policy, policy_params, inits / stages.POLICY_SAMPLES, progress
    )
    # A WM trunk shared with the policy starts from its weights: the checkpoint's (policy
    # params before the warm start) or, with wm.trunk_from_policy, the warm-started ones.
    trunk = policy_params if config.wm.trunk_from_policy else policy.state.params
    wm = model_setup.build_wm(
        config, vocab, model_setup.adam(config.wm.online_learning_rate), mesh,
        wm_pretraining.wm_seed(config), trunk_params=trunk,
    )  # fmt: skip
    feature_wm = None
    if config.wm.kind == "features":  # the script-feature scorer stands in for the WM
        from wmrl.autoresearch.feature_wm import FeatureWM

        feature_wm = FeatureWM(config, prepared, samples)
        wm_params, wm_report = wm.state.params, feature_wm.report()  # no neural pretraining
    elif config.wm.kind == "verdict":  # the policy's own backbone, frozen, as the WM
        from wmrl.autoresearch.verdict_wm import VerdictWM

        lm = policy_params if config.wm.verdict_from == "warm_start" else policy.state.params
        feature_wm = VerdictWM(config, prepared, lm, vocab)
        wm_params = wm.state.params  # frozen: the neural WM's, neither called nor trained
        if feature_wm.trains:  # fine-tuned before RL; RL's WM state is then the LM's
            recs = [r for r in prepared.executions if r["split"] == "train"]
            wm_params = feature_wm.finetune(recs + stages.policy_fit_records(config, samples or []),
                                            mesh)  # fmt: skip
            wm = feature_wm.lm_model(mesh, model_setup.adam(config.wm.online_learning_rate))
        wm_report = feature_wm.report()
    else:
        wm_params, wm_report = wm_pretraining.pretrain_wm(
            config, prepared, wm, inits / "wm_pretrain", progress, samples=samples
        )
    return Stages(
        prepared, policy, wm, policy_params, wm_params, sft_report, wm_report,
        time.monotonic() - t0, samples_report, feature_wm,
    )  # fmt: skip


def run(
    config, workdir: str | os.PathLike, write_outputs: bool = True, progress: bool = True
) -> dict:
    """Run (or resume) the whole pipeline; returns the summary."""
    from wmrl.autoresearch.checkpoint import Checkpointer

    workdir = epath.Path(workdir)
    quiet_orbax()
    rlconfig.validate_autoresearch_config(config)
    workdir.mkdir(parents=True, exist_ok=True)
    # suite.executor: this host's pool or one per Ray node; every execution seeded from the
    # run's seed and its key (the same when a resumed run executes it again)
    pool = _ExecutorStart(config)
    try:
        s = prepare_stages(config, workdir, progress)
    except BaseException:
        pool.close()
        raise
    pool = pool.result()
    policy_params, wm_params = s.policy_params, s.wm_params

    log = _Log(workdir, write_outputs)
    ckpt = Checkpointer(workdir, config.rl.keep_checkpoints)
    trainer = make_trainer(config, s, pool, workdir)
    try:
        st = trainer.initial_state(policy_params, wm_params)
        restored = ckpt.restore_latest(st)
        if restored is not None:
            st = restored
            print(f"resuming from the checkpoint of step {st.step}", flush=True)
            log.restart_at(st.step)
        else:
            log.restart_at(None)
        if not st.evals:  # the warm-start policy's held-out reward, step 0
            ev = trainer.evaluate(st)
            st.evals.append(ev)
            log.write("metrics.jsonl", [{"kind": "eval", **ev}], st.step)
            log.flush()  # before the checkpoint: records never lag behind it
            ckpt.save(st, rlconfig.rl_seed(config))
        st, compile_s = _train(config, trainer, st, log, ckpt, progress)
    finally:
        trainer.journal.close()
        if getattr(trainer, "cost", None) is not None:  # cost routing's capped rows
            trainer.cost.journal.close()
        trainer.eval_journal.close()
        pool.close()
        ckpt.close()
        log.close()
    summary = make_summary(config, st, s.sft_report, s.wm_report, s.seconds, compile_s)
    summary["wm_pretraining_executions"] = stages.wm_pretraining_executions(
        s.prepared, s.policy_samples_report
    )  # beside real_executions (RL's)
    if s.policy_samples_report is not None:  # the stage's cost (executions, seconds)
        summary["policy_samples"] = {
            k: v for k, v in s.policy_samples_report.items() if k != "config"
        }
    if write_outputs:
        records = read_jsonl(workdir / "metrics.jsonl")
        pairs = read_jsonl(workdir / "pairs.jsonl")
        plot_run(
            workdir, [r for r in records if r["kind"] == "step"], st.evals, pairs,
            config.target_reward,
        )  # fmt: skip
        summary["anchor_figures"] = anchor_figures(config, pairs, st.step)
        if config.routing == "cost":  # the cap, the real-row share, the cut rows
            from wmrl.autoresearch.cost_routing import cost_summary
            from wmrl.autoresearch.plots import plot_cost_routing

            steps = [r for r in records if r["kind"] == "step"]
            summary.update(cost_summary(steps, pairs))
            plot_cost_routing(workdir, steps)
        (workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class _ExecutorStart:
    """The RL run's executor (`suite.executor`), started while the stages load.

    A local pool's start is a template process importing the sandbox's libraries and the
    start-up canary run through the sandbox (~3 s on the idle 2-core machine, in other
    processes): a thread starts it beside the stages' loading (`prepare_stages`, on this
    process's core). A start-up failure is raised by `result()`, after the stages, exactly
    as before. The Ray executor starts in `result()`, on the calling thread (ray.init
    installs signal handlers, which only the main thread may).
    """

    def __init__(self, config):
        from wmrl.autoresearch.env.executor import make_executor

        self._make = lambda: make_executor(config.suite, seed=rlconfig.rl_seed(config))
        self._thread = None
        if config.suite.get("executor", "local") == "local":
            self._box: dict = {}
            self._thread = threading.Thread(target=self._start, name="executor-start", daemon=True)
            self._thread.start()

    def _start(self) -> None:
        try:
            self._box["pool"] = self._make()
        except BaseException as e:  # raised again by result()
            self._box["error"] = e

    def result(self):
        if self._thread is None:
            return self._make()
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["pool"]

    def close(self) -> None:
        """Close the pool once started (the stages failed)."""
        if self._thread is not None:
            self._thread.join()
            if "pool" in self._box:
                self._box["pool"].close()


def make_trainer(config, s: Stages, pool, workdir):
    """The single-turn `Trainer` (with the feature scorer as its WM under `wm.kind =
    "features"`), or for `env.turns` > 1 the episode trainer (`wmrl.autoresearch.multiturn`),
    on the stages' outputs."""
    if config.env.turns > 1:
        from wmrl.autoresearch.multiturn import MultiTurnTrainer

        return MultiTurnTrainer(config, s.prepared, s.policy, s.wm, pool, workdir)
    from wmrl.autoresearch.trainer import Trainer

    return Trainer(config, s.prepared, s.policy, s.wm, pool, workdir, feature_wm=s.feature_wm)


class _Loop:
    """The AutoResearch side of the run loop (`wmrl.experiment.loop`): the trainer's step
    (its executions journalled and, on a remote workdir, uploaded as the step ends), its
    evaluation, the Orbax checkpoint of the whole `RunState`, the run's step log."""

    def __init__(self, config, trainer, log: _Log, ckpt):
        self.config, self.trainer, self.records, self.ckpt = config, trainer, log, ckpt

    def step(self, st):
        st, metrics, pairs = self.trainer.run_step(st)
        self.trainer.journal.flush()  # remote workdir: the step's executions, uploaded
        if getattr(self.trainer, "cost", None) is not None:
            self.trainer.cost.journal.flush()
        return st, metrics, {"pairs.jsonl": pairs}  # with the lag: the last step's anchors

    def position(self, st) -> tuple[int, float]:
        return st.step, st.wall_time_s

    def evaluate(self, st, trained_s: float, settle_s: float):
        # Stamped when its policy existed: the wait for the anchors still executing (which
        # an uninterrupted run overlaps with its next step) does not change the policy; it
        # is counted in wall_time_s all the same, so every later step and evaluation
        # carries it.
        ev = {**self.trainer.evaluate(st), "wall_time_s": trained_s, "anchor_drain_s": settle_s}
        st.evals.append(ev)
        return st, ev

    def save(self, st) -> None:
        self.records.flush()  # before the checkpoint: records never lag behind it
        self.ckpt.save(st, rlconfig.rl_seed(self.config))

    def log(self, name: str, records: list[dict], step: int) -> None:
        self.records.write(name, records, step)


def _train(config, trainer, st, log: _Log, ckpt, progress: bool):
    """The RL loop from `st` to `rl.steps` (or the wall-clock budget): step, log, evaluate,
    checkpoint (`wmrl.experiment.loop.run_loop`; before untimed work the anchors still
    executing in the background finish, timed). Returns the final state and the warm-up's
    compile seconds."""
    steps, budget = config.rl.steps, config.rl.max_wall_time_s
    compile_s = 0.0
    if st.step < steps:
        if progress:
            print("compiling the RL step (not counted in wall_time_s)", flush=True)
        compile_s = trainer.warmup(st)
    bar = _progress_bar(config, st, steps, budget, progress)

    def on_step(st, metrics: dict) -> None:
        bar.update((_bar_time(st, budget) if budget else st.step) - bar.n)
        bar.set_postfix(
            step=st.step,
            reward=f"{metrics['train_reward']:.3f}",
            heldout=f"{st.evals[-1]['heldout_reward']:.3f}",
        )

    st = run_loop(
        _Loop(config, trainer, log, ckpt), st, steps, config.rl.eval_every,
        config.rl.checkpoint_every, budget_s=budget, eval_due=lambda st: _eval_due_s(config, st),
        settle=trainer.drain, on_step=on_step,
    )  # fmt: skip
    bar.close()
    return st, compile_s


def anchor_figures(config, pairs: list[dict], steps: int) -> dict | None:
    """What the static check cannot see, on the run's anchor pairs
    (`wmrl.autoresearch.anchor_metrics.anchor_report`: learned-row within-group Spearman,
    failure AUC among unflagged rows, Spearman among VALID rows, P(timeout) calibration),
    over the whole run (`all`) and per quarter of its `steps` RL steps (`quarters`); None
    in a mode without a WM (`real`: its pairs carry no WM score)."""
    from wmrl.core.correct import MODE_SPECS

    if not MODE_SPECS[config.mode].uses_wm:
        return None
    return anchor_metrics.anchor_report(pairs, max(steps, 1))


def _eval_due_s(config, st) -> bool:
    """Whether training wall-clock passed a multiple of `rl.eval_every_s`, or a point of
    `rl.eval_at_s`, since the last evaluation (neither set = evaluations by step count only):
    modes whose steps take different times are then evaluated at the same wall-clock points
    (the speedup benchmark)."""
    last, now = st.evals[-1]["wall_time_s"], st.wall_time_s
    if any(last < p <= now for p in config.rl.eval_at_s):
        return True
    every = config.rl.eval_every_s
    return bool(every) and now // every > last // every


def _progress_bar(config, st, steps: int, budget: float, progress: bool) -> tqdm:
    """Steps out of `rl.steps`; under a wall-clock budget (`rl.max_wall_time_s`, e.g. the
    speedup benchmark's `--budget_s`, which lifts the step limit) training seconds out of the
    budget, so that the ETA means something (the step is in the postfix)."""
    desc = f"RL ({config.mode})"
    if budget:
        return tqdm(total=round(budget), initial=_bar_time(st, budget), unit="s", desc=desc,
                    disable=not progress)  # fmt: skip
    return tqdm(total=steps, initial=st.step, unit="step", desc=desc, disable=not progress)


def _bar_time(st, budget: float) -> int:
    return round(min(st.wall_time_s, budget))


def time_to_target(evals: list[dict], target: float) -> float | None:
    """Training wall-clock at the first evaluation whose held-out reward reached `target`."""
    return summaries.first_reaching(evals, "heldout_reward", target, "wall_time_s")


def _by_turn(evals: list[dict]) -> dict:
    """Multi-turn runs: the held-out reward of the best of the first t turns (a list, turn 1
    first) for the warm start and the final policy; nothing for single-turn runs."""
    if "heldout_reward_by_turn" not in evals[0]:
        return {}
    return {
        "warmstart_heldout_reward_by_turn": evals[0]["heldout_reward_by_turn"],
        "final_heldout_reward_by_turn": evals[-1]["heldout_reward_by_turn"],
        "final_heldout_improved_fraction": evals[-1]["heldout_improved_fraction"],
    }


CURVE_KEYS = ("step", "wall_time_s", "real_executions", "heldout_reward", "heldout_reward_se")


def make_summary(
    config, st, sft_report: dict, wm_report: dict, stage_s: float, compile_s: float = 0.0
) -> dict:
    evals = st.evals
    held = {k: v for k, v in wm_report["heldout"].items() if k not in ("scores", "targets")}
    return {
        "mode": config.mode,
        "routing": config.routing,
        "steps": st.step,
        **summaries.curve_figures(evals, "heldout_reward"),
        "wall_time_s": st.wall_time_s,
        "target_reward": config.target_reward,
        "time_to_target_s": time_to_target(evals, config.target_reward),
        "real_executions": st.real_executions,
        "wm_calls": st.wm_calls,
        "eval_executions": len(evals)
        * config.rl.eval_samples
        * len(evals[0]["heldout_per_task"])
        * config.env.turns,
        "heldout_curve": summaries.heldout_curve(evals, CURVE_KEYS),
        "final_heldout_status_rates": evals[-1]["heldout_status_rates"],
        # the change since the warm start, paired by held-out task (learning vs noise)
        **evaluation.heldout_change(evals[0], evals[-1]),
        **_by_turn(evals),
        "wm_kind": config.wm.kind,
        "wm_pretrain_heldout": held,
        # without the stage's config (a loaded stage's report carries it, a built one's not)
        "warm_start": {k: v for k, v in sft_report.items() if k != "config"},
        "stages_s": stage_s,
        "compile_s": compile_s,
        "device": str(jax.devices()[0].device_kind),
    }
