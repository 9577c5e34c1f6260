"""The AutoResearch config: its typed schema (every field's one default), validation, the
trainer's settings, and how saved runs compare.

`AutoResearchConfig` is a tree of frozen sections (`wmrl.experiment.config`): AutoResearch's
own (`suite`, `env`, `data`, `pretrained`, `policy`, `wm`) and the ones it shares with the
embodied experiment (`rl`, extended by `AutoResearchRL`, and `correction`,
`wmrl.experiment.sections`). The defaults of AutoResearch's own sections are the tiny job's
(configs/autoresearch_tiny.py, which sets the shared sections' values it needs on top);
`defaults()` is the ConfigDict every AutoResearch config file starts from. A field missing
from a config, or one the schema does not know, is an error naming it.

`validate_autoresearch_config` reads a ConfigDict (unchanged) into the schema, checks what
the schema cannot (the suite, the executor, a pretrained checkpoint) and returns
`TrainerConfig`, the frozen settings of the RL step. Every error names the config field.
Validation runs before anything is written or any device memory is allocated, and needs no
config file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from pathlib import Path

from wmrl import storage
from wmrl.autoresearch.cost_routing import CheapConfig
from wmrl.autoresearch.env.executor import EXECUTORS
from wmrl.autoresearch.env.task import MAX_TIME_LIMIT_S
from wmrl.config_errors import ConfigError
from wmrl.core.correct import MODE_SPECS, SAMPLE_FUSIONS, ModeSpec, resolve_fusion
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.fidelity import AdaptiveRhoConfig
from wmrl.core.routing import RoutingConfig, num_anchor_groups
from wmrl.experiment import config as xconfig
from wmrl.experiment import renamed
from wmrl.experiment.config import ConfigHistory, Section, section, setting, subsection
from wmrl.experiment.sections import CorrectionConfig, RLConfig, RunConfig, rl_seed
from wmrl.models.config import NAMED_SIZES

# The built-in suite's tasks the tiny job trains and evaluates on: every training task (more
# prompts make a warm start that generalises) and 32 held-out tasks that share the column
# naming of most training tasks (`target`, `id`), so what has to transfer is the craft
# (impute, encode, write the submission, no syntax slips) rather than copying unseen column
# names, which a policy this small cannot learn in minutes: three hand-made ones and 29
# members of the generated family of the same kinds (`heldout-family-NN`,
# `wmrl.autoresearch.env.suite.heldout_family`). Many tasks with few scripts each
# (`rl.eval_samples`) make one evaluation's standard error, which counts the variance between
# tasks, smaller for the same executions (docs/results.md).
TINY_TASKS = (
    "iris-species", "wine-cultivar", "breast-cancer-auc", "digits-8x8",
    "diabetes-progression", "penguins-species", "penguins-body-mass", "cars-mpg",
    "seattle-weather-type", "synth-easy", "synth-imbalanced-f1", "synth-imbalanced-auc",
    "synth-high-dim", "synth-regression-noisy", "friedman1", "friedman2", "hastie-10-2",
    "large-n-tight", "large-n-regression", "synth-missing", "synth-categorical",
    "breast-cancer-missing", "wine-noisy-labels", "diabetes-mae", "moons", "circles-auc",
    "heldout-categorical-missing", "heldout-gaussian-quantiles", "heldout-imbalanced-missing",
    *(f"heldout-family-{j:02d}" for j in range(1, 30)),
)  # fmt: skip


@section
class SuiteConfig(Section):
    """The task suite and where its sandboxes run (`config.suite`)."""

    dir: str = ""  # an existing suite (task dirs + suite.json); '' = build `tasks` below
    tasks: tuple[str, ...] = TINY_TASKS
    workers: int = setting(2, low=1)  # sandbox slots (same for every mode); per node with ray
    # Where sandboxes run (docs/ray.md): "local" (this host) | "ray" (one pool per Ray node).
    executor: str = setting("local", choices=EXECUTORS)
    ray_address: str = "auto"  # "auto" | "local" (start one here) | "ray://host:port"
    allow_mixed_isolation: bool = False  # executor=ray: accept nodes at different namespaces levels
    time_limit_s: float = setting(20.0, above=0)  # caps each task's own time limit (s)

    def check(self) -> None:
        if self.time_limit_s > MAX_TIME_LIMIT_S:
            raise ConfigError(
                "time_limit_s",
                f"must be at most {MAX_TIME_LIMIT_S:g} s (a day: the longest time limit a task "
                f"may have), got {self.time_limit_s!r}",
            )


@section
class EnvConfig(Section):
    """The episode (docs/method.md): `turns` = K scripts per episode, each executed once, the
    agent reading an observation of each turn but the last; the trajectory reward is the best
    turn's. K = 1 is the single-turn setting exactly (configs/autoresearch_multiturn.py)."""

    turns: int = setting(1, low=1, note="scripts per episode")
    # K > 1: executed multi-turn episodes per training task for the warm start (a script with
    # a controlled mistake, its real observation, the fix; or a good script kept or improved).
    sft_episodes_per_task: int = setting(4, low=0)


@section
class DataConfig(Section):
    """The authored corpus and the prompt budget (`config.data`)."""

    scripts_per_task: int = setting(12, low=1)  # authored scripts executed per task (WM, SFT)
    sft_scripts_per_task: int = setting(40, low=0)  # more authored scripts, SFT only
    # Executed per held-out task, only to measure the pretrained WM on unseen tasks (nothing
    # trains on them); -1: as many as data.scripts_per_task.
    heldout_scripts_per_task: int = -1
    mistake_rate: float = setting(0.35, low=0.0, high=1.0)
    vocab_size: int = setting(4000, low=1)
    max_prompt_len: int = setting(96, low=1)
    max_new_tokens: int = setting(256, low=1)

    def check(self) -> None:
        held = self.heldout_scripts_per_task
        if not (held == -1 or held >= 1):
            raise ConfigError(
                "heldout_scripts_per_task",
                f"must be -1 (as data.scripts_per_task) or an integer >= 1, got {held!r}",
            )


@section
class PretrainedConfig(Section):
    """Start policy and WM trunk from a Hugging Face checkpoint (Qwen3 or Llama dense,
    safetensors): a local directory; '' = the tiny random transformer of `policy` and a
    SentencePiece tokenizer trained on the corpus. See configs/qwen3_4b.py; checked by
    `wmrl.autoresearch.pretrained.validate`."""

    checkpoint: str = ""
    dtype: str = "float32"  # compute dtype
    param_dtype: str = "float32"  # master weights (and Adam moments)
    remat: bool = False
    wm_trunk: bool = True  # WM trunk = the checkpoint too (else wm.* below, random)
    prompt_template: str = "{prompt}"  # e.g. a chat template for instruct models


@section
class PolicyConfig(Section):
    """The tiny random policy transformer and its warm start by SFT (`config.policy`)."""

    size: str = setting("tiny", choices=tuple(NAMED_SIZES))
    d_model: int = setting(128, low=1)
    num_layers: int = setting(2, low=1)
    mlp_dim: int = setting(384, low=1)
    head_dim: int = setting(32, low=1)
    sft_steps: int = setting(300, low=0)
    sft_batch_size: int = setting(16, low=1)
    sft_learning_rate: float = setting(3e-3, above=0)


@section
class WMConfig(Section):
    """The world model: its trunk, pretraining and online fine-tuning (`config.wm`)."""

    # What scores the WM stream: "neural" (the transformer WM below), "features" (a ridge
    # regression on script and card features any user could list, refitted on the anchors:
    # wmrl/autoresearch/feature_wm.py, the baseline the neural WM must beat; single-turn) or
    # "verdict" (the paper's: the policy's own backbone prompted as a simulator decodes a
    # schema-bound verdict, wmrl/autoresearch/verdict_wm.py; single-turn; the wm.verdict_*
    # fields below).
    kind: str = setting("neural", choices=("neural", "features", "verdict"))
    d_model: int = setting(64, low=1)
    num_layers: int = setting(2, low=1)
    mlp_dim: int = setting(192, low=1)
    head_dim: int = setting(16, low=1)
    num_members: int = setting(4, low=1)
    pretrain_steps: int = setting(200, low=0)  # the most pretraining steps (fewer if stopped)
    # Early stopping (wmrl.autoresearch.wm_pretraining.pretrain_wm): every e > 0 steps the WM's
    # within-task ranking of held-out rows (the held-out policy samples when the WM fits on
    # policy samples, else the corpus validation split) is measured; the best parameters are
    # kept and training stops after `pretrain_patience` measurements without a new best.
    # 0 = train exactly `pretrain_steps`.
    pretrain_eval_every: int = setting(0, low=0)
    pretrain_patience: int = setting(5, low=1)
    seed: int = setting(-1, low=-1)  # the WM's init and pretraining-batch seed; -1 = seed + 1
    batch_size: int = setting(16, low=1)
    learning_rate: float = setting(1e-3, above=0)
    rank_coef: float = setting(0.0, low=0)  # within-task pairwise ranking loss (0 = NLL only)
    # Runtime head (censored log-runtime NLL, this weight; 0 = no head): the WM score becomes
    # (1 - P(timeout)) * reward head + P(timeout) * TIMEOUT's reward, P(timeout) under the
    # script's time limit (the task's, capped by suite.time_limit_s). docs/results.md.
    runtime_coef: float = setting(0.5, low=0)
    # Multi-turn feedback heads (wmrl/autoresearch/wm_observation.py; 0 = no head): the
    # exception class of a RUNTIME_ERROR (observation.ERROR_TYPES) and the raw validation
    # metric (episode executions only). The single-turn job reads no feedback: off.
    error_type_coef: float = setting(0.0, low=0)
    validation_coef: float = setting(0.0, low=0)
    trunk_from_policy: bool = False  # WM trunk = the warm-started policy's (its width, weights)
    validation_every: int = setting(0, low=0)  # k > 0: every k-th script of a train task held out
    group_rows: int = setting(1, low=1)  # pretraining batches of tasks x this many scripts
    # k > 0: after the warm start, k scripts per training task sampled from the policy as RL
    # samples and executed as RL executes (a cached stage, <init_dir>/policy_samples), added
    # to the WM pretraining rows: the WM then sees the scripts it scores in RL. 0 = corpus only.
    policy_samples_per_task: int = setting(0, low=0)
    # Every v-th policy sample of each task is held out of pretraining (the report's
    # policy_validation: within-task Spearman on new policy scripts); 0 = none held out.
    policy_validation_every: int = setting(4, low=0)
    online_learning_rate: float = setting(3e-4, above=0)
    online_steps: int = setting(2, low=0)  # WM fine-tuning steps per RL step, on the replay
    replay_size: int = setting(512, low=1)
    # wm.kind = "verdict" (docs/world_model.md). Its LM: the warm-started policy's parameters
    # or those the warm start began from (a pretrained checkpoint's in the pod configs).
    verdict_from: str = setting("warm_start", choices=("warm_start", "checkpoint"))
    # "frozen" (the reference's design) or "finetune": trained on the verdicts real outcomes
    # deserve, before RL for verdict_finetune_steps steps (wm.batch_size, wm.learning_rate) on
    # the corpus and the policy samples, then online on the anchors (wm.online_steps).
    verdict_train: str = setting("frozen", choices=("frozen", "finetune"))
    verdict_finetune_steps: int = setting(200, low=0)
    # "expected": the expected reward over the teacher-forced probabilities of every (status,
    # bucket) outcome, with their variance; "sampled": the reward of one decoded verdict's
    # top prediction (the reference's).
    verdict_score: str = setting("expected", choices=("expected", "sampled"))
    verdict_prompt_len: int = setting(2048, low=64)  # prompt tokens (the script is cut to fit)
    verdict_overview_chars: int = setting(4000, low=1)  # the task card's cap in the prompt
    verdict_inventory_chars: int = setting(2000, low=1)  # the public files' listing's cap
    verdict_script_chars: int = setting(8000, low=1)  # the numbered script's cap
    verdict_reason_tokens: int = setting(64, low=0)  # decoded free-text caps (sampled mode)
    verdict_error_type_tokens: int = setting(8, low=0)
    verdict_feedback_tokens: int = setting(96, low=0)
    verdict_temperature: float = setting(0.7, above=0)  # sampled mode (top-k 20, top-p 0.8)


@section
class AutoResearchRL(RLConfig):
    """`config.rl`: the shared GRPO fields and AutoResearch's own."""

    max_wall_time_s: float = setting(0.0, low=0)  # stop RL at this training wall-clock (0 = no)
    batch_size: int = setting(0, low=0)  # trajectories per step; 0 = groups_per_step * group_size
    num_micro_batches: int = setting(1, low=1)  # gradient-accumulation chunks of the update
    entropy_coef: float = setting(0.0, low=0)  # entropy bonus in the policy loss (0 = off)
    std_eps: float = setting(1e-4, above=0)  # added to a group's std when normalize_std
    baseline: str = setting("mean", choices=("mean", "rloo"))
    # Also evaluate whenever training wall-clock passes a multiple of this (0 = off), and at
    # the first step boundary at or after each of the training wall-clock points (s) below:
    # modes with different step times are then evaluated at the same wall-clock points.
    eval_every_s: float = setting(0.0, low=0)
    eval_at_s: tuple[float, ...] = setting((), above=0)
    eval_samples: int = setting(3, low=1)  # scripts (episodes) per held-out task per evaluation
    keep_checkpoints: int = setting(3, low=1)

    def groups(self) -> int:
        """B, the step's groups: `batch_size // group_size` when a batch size is given, else
        `groups_per_step`."""
        return self.batch_size // self.group_size if self.batch_size else self.groups_per_step

    def check(self) -> None:
        if self.batch_size % self.group_size:
            raise ConfigError(
                "batch_size",
                f"{self.batch_size} trajectories do not divide into groups of rl.group_size="
                f"{self.group_size}; group size is a static shape, never reshaped silently",
            )
        rows = self.groups() * self.group_size
        if rows % self.num_micro_batches:
            raise ConfigError(
                "num_micro_batches",
                f"must be a positive divisor of the {rows} trajectories per step, got "
                f"{self.num_micro_batches!r}",
            )
        points = self.eval_at_s
        for i in range(1, len(points)):
            if points[i] <= points[i - 1]:
                raise ConfigError(
                    "eval_at_s", f"points must increase: point {i} ({points[i]!r}) <= point "
                    f"{i - 1} ({points[i - 1]!r})",
                )  # fmt: skip


@section
class AutoResearchConfig(RunConfig):
    """Every field of an AutoResearch run (configs/autoresearch_tiny.py and the configs that
    extend it). `model` and `mesh_shape` are the pod configs' (a pretrained architecture
    spelled out for the AOT check, the device mesh); other configs leave them out."""

    experiment: str = setting("autoresearch", choices=("autoresearch",))
    target_reward: float = 0.65  # held-out reward that defines time_to_target_s
    # Shared, resumable data stage (suite subset, executed corpus, tokenizer). '' = <workdir>/data.
    data_dir: str = ""
    suite: SuiteConfig = subsection(SuiteConfig)
    env: EnvConfig = subsection(EnvConfig)
    data: DataConfig = subsection(DataConfig)
    pretrained: PretrainedConfig = subsection(PretrainedConfig)
    policy: PolicyConfig = subsection(PolicyConfig)
    wm: WMConfig = subsection(WMConfig)
    rl: AutoResearchRL = subsection(AutoResearchRL)
    correction: CorrectionConfig = subsection(CorrectionConfig)
    model: dict | None = setting(None, optional=True)  # a TransformerConfig's fields
    mesh_shape: tuple[int, ...] | None = setting(None, optional=True)

    def check(self) -> None:
        super().check()
        self._check_turns()
        self._check_adaptive_rho()
        self._check_cost_routing()
        if self.wm.kind == "features" and self.env.turns > 1:
            raise ConfigError(
                "wm.kind",
                f"'features' scores single scripts; env.turns={self.env.turns} needs the neural "
                "WM, which also predicts each turn's observation",
            )
        self._check_verdict_wm()
        if self.wm.policy_samples_per_task and self.env.turns > 1:
            raise ConfigError(
                "wm.policy_samples_per_task",
                f"policy samples are single-turn scripts; with env.turns={self.env.turns} use 0",
            )

    def _check_verdict_wm(self) -> None:
        """The verdict WM: single-turn for now, so far as it is built."""
        if self.wm.kind != "verdict":
            return
        if self.env.turns > 1:
            raise ConfigError(
                "wm.kind",
                f"'verdict' is single-turn so far (env.turns={self.env.turns}): its env_feedback "
                "as a WM-scored turn's observation is not built; use env.turns=1",
            )

    def _check_turns(self) -> None:
        """For K > 1: synchronous anchors and a prompt budget that holds one turn's history."""
        from wmrl.autoresearch.history import min_prompt_len

        turns = self.env.turns
        if turns > 1 and self.rl.anchor_lag:
            raise ConfigError(
                "rl.anchor_lag",
                f"must be 0 with env.turns={turns}: an anchor episode's next turn is written "
                "from its real observation, so its executions cannot run a step behind",
            )
        need = min_prompt_len(self.data.max_new_tokens)
        if turns > 1 and self.data.max_prompt_len < need:
            raise ConfigError(
                "data.max_prompt_len",
                f"{self.data.max_prompt_len} tokens cannot hold one turn's history with "
                f"env.turns={turns}: the card, the last script (data.max_new_tokens="
                f"{self.data.max_new_tokens}) and its observation need >= {need}",
            )

    def _check_cost_routing(self) -> None:
        """`routing = cost` needs its cap (one of the two fields), below the RL time limit;
        the cap is read only there; the pool that runs it is local (the Ray executor has no
        cap)."""
        c, cost = self.correction, self.routing == "cost"
        for name in ("cheap_limit_s", "cheap_quantile"):
            if getattr(c, name) and not cost:
                raise ConfigError(
                    f"correction.{name}",
                    f"is the cap of cost-aware routing, read only with routing='cost' (got "
                    f"routing={self.routing!r}); set routing='cost' or leave it 0",
                )
        if not cost:
            return
        if not (c.cheap_limit_s or c.cheap_quantile):
            raise ConfigError(
                "correction.cheap_limit_s",
                "routing='cost' needs its cap: correction.cheap_limit_s (seconds) or "
                "correction.cheap_quantile (a quantile in (0, 1) of recent execution times)",
            )
        if c.cheap_quantile and not MODE_SPECS[self.mode].uses_wm:
            raise ConfigError(
                "correction.cheap_quantile",
                f"mode {self.mode!r} executes every row under the cap, none in full: no "
                "unbiased sample of execution times to take the quantile of; use "
                "correction.cheap_limit_s",
            )
        if c.cheap_limit_s > self.suite.time_limit_s:
            raise ConfigError(
                "correction.cheap_limit_s",
                f"({c.cheap_limit_s!r} s) is above the time limit suite.time_limit_s "
                f"({self.suite.time_limit_s!r} s): a cap must lie below the limit it cuts",
            )
        if self.env.turns > 1:
            raise ConfigError(
                "routing",
                f"'cost' is single-turn so far (env.turns={self.env.turns}): capped turns, "
                "whose cut observation the WM would write, are not built; use 'uniform'",
            )
        if self.suite.executor != "local":
            raise ConfigError(
                "routing",
                f"'cost' needs the local sandbox pool (suite.executor={self.suite.executor!r} "
                "has no cap below the time limit)",
            )

    def _check_adaptive_rho(self) -> None:
        """The adaptive anchor fraction only where a WM stream is measured and may be
        thinned, and never down to steps without an anchor group."""
        c = self.correction
        if not c.adaptive_rho:
            return
        spec = MODE_SPECS[self.mode]
        if not spec.uses_wm:
            raise ConfigError(
                "correction.adaptive_rho",
                f"mode {self.mode!r} has no WM stream to measure (it executes every group); "
                "use a mode with a world model or adaptive_rho=False",
            )
        if spec.constant:
            raise ConfigError(
                "correction.adaptive_rho",
                f"the control {self.mode!r} keeps a fixed anchor fraction (correction.rho): it "
                "is the plain verifiers + anchors baseline; use adaptive_rho=False",
            )
        n = self.rl.groups()
        if max(math.floor(c.rho_min * n + 0.5), c.min_groups) < 1:
            raise ConfigError(
                "correction.rho_min",
                f"({c.rho_min!r}) with correction.min_groups=0 gives steps with no anchor group "
                f"out of {n}: the adaptive rule could never measure the WM again; raise it or "
                "min_groups",
            )


# ----------------------------------------------------------------------------- saved runs


def _resolved(flat: dict) -> dict:
    """Fields compared by what they do: `correction.sample_fusion` as the fusion it means in
    the run's mode (a run saved with `inverse_variance` in `wmrl` resumes under `auto`);
    `rl.anchor_lag` as 0 with `env.turns` > 1 (multi-turn runs saved with 1 ran without one)."""
    if flat.get("env.turns", 1) > 1 and flat.get("rl.anchor_lag"):
        flat = {**flat, "rl.anchor_lag": 0}  # saved before it was refused: they ran with none
    fusion, mode = flat.get("correction.sample_fusion"), flat.get("mode")
    if fusion in SAMPLE_FUSIONS and mode in MODE_SPECS:
        fused = resolve_fusion(fusion, MODE_SPECS[mode])
        flat = {**flat, "correction.sample_fusion": "inverse_variance" if fused else "mean"}
    return flat


# Saved AutoResearch runs and stage fingerprints. `added`: fields added after runs were
# written, with the value that reproduces what those runs did (`env`: a run or stage saved
# before multi-turn episodes existed was single-turn; runs before `sample_fusion` fused the
# WM members by inverse variance in every mode; before the adaptive rule's parameters were
# fields, it ran with `AdaptiveRhoConfig`'s). `renamed`: fields saved configs may hold under
# an old name (`wmrl.experiment.renamed`).
# `resumable`: fields a resumed run may change
# (they do not change what a completed step computed).
HISTORY = ConfigHistory(
    renamed=renamed.FIELDS,
    added={
        "wm.runtime_coef": 0.0, "wm.error_type_coef": 0.0, "wm.validation_coef": 0.0,
        "correction.adaptive_rho": False, "correction.rho_min": 0.125,
        "correction.rho_max": 1.0, "env.turns": 1, "env.sft_episodes_per_task": 4,
        "rl.seed": -1, "wm.policy_samples_per_task": 0, "wm.policy_validation_every": 4,
        "correction.sample_fusion": "inverse_variance",
        "correction.corr_low": 0.0, "correction.corr_high": 0.5,
        "correction.rho_half_life": 16.0, "correction.rho_warmup_groups": 8,
        "correction.debias": "monotone",
        "wm.seed": -1, "wm.pretrain_eval_every": 0, "wm.pretrain_patience": 5,
        "wm.kind": "neural", "correction.cheap_limit_s": 0.0, "correction.cheap_quantile": 0.0,
        "wm.verdict_from": "warm_start", "wm.verdict_train": "frozen",
        "wm.verdict_score": "expected", "wm.verdict_prompt_len": 2048,
        "wm.verdict_overview_chars": 4000, "wm.verdict_inventory_chars": 2000,
        "wm.verdict_script_chars": 8000, "wm.verdict_reason_tokens": 64,
        "wm.verdict_error_type_tokens": 8, "wm.verdict_feedback_tokens": 96,
        "wm.verdict_temperature": 0.7, "wm.verdict_finetune_steps": 200,
    },
    resolve=_resolved,
    resumable=(
        "rl.steps", "rl.max_wall_time_s", "rl.eval_every", "rl.eval_every_s", "rl.eval_at_s",
        "rl.checkpoint_every", "rl.keep_checkpoints",
    ),
)  # fmt: skip


def defaults():
    """The ConfigDict every AutoResearch config file starts from (every field's default)."""
    return xconfig.defaults(AutoResearchConfig)


def parse_config(config) -> AutoResearchConfig:
    """`config` (a ConfigDict or dict, unchanged) as the typed AutoResearch config."""
    if isinstance(config, AutoResearchConfig):
        return config
    return xconfig.parse(AutoResearchConfig, config, renamed=HISTORY.renamed)


def validate_autoresearch_config(config) -> TrainerConfig:
    """Check `config` (unchanged) and return the trainer's typed settings built from it."""
    cfg = parse_config(config)
    _check_suite(cfg)
    storage.require_local(cfg.data_dir, "data_dir")
    from wmrl.autoresearch import pretrained

    pretrained.validate(config, cfg.data.max_prompt_len + cfg.data.max_new_tokens)
    cores = os.cpu_count() or 1
    if cfg.suite.workers > cores:
        warnings.warn(
            f"config.suite.workers={cfg.suite.workers} is above the {cores} CPU cores of this "
            "machine: the sandboxes will share cores and every execution will run slower",
            stacklevel=2,
        )
    return trainer_config(cfg)


def _check_suite(cfg: AutoResearchConfig) -> None:
    """The executor (reachable), the suite folder or the built-in task ids."""
    from wmrl.autoresearch.env.executor import validate_suite_executor

    validate_suite_executor(cfg.suite, reachable=True)  # executor, ray_address, mixed isolation
    storage.require_local(cfg.suite.dir, "suite.dir")
    if cfg.suite.dir:
        if not (Path(cfg.suite.dir) / "suite.json").exists():
            raise ConfigError(
                "config.suite.dir",
                f"{cfg.suite.dir!r} is not a task suite (no suite.json); build one with "
                "`python -m wmrl.autoresearch.env.suite --out=DIR` or leave it empty",
            )
        return
    from wmrl.autoresearch.env.suite import suite_tasks

    known = {t.id: t.split for t in suite_tasks()}
    unknown = [t for t in cfg.suite.tasks if t not in known]
    if unknown:
        raise ConfigError("config.suite.tasks", f"unknown built-in task ids {unknown}")
    splits = {known[t] for t in cfg.suite.tasks}
    for split in ("train", "heldout"):
        if split not in splits:
            raise ConfigError("config.suite.tasks", f"needs at least one {split} task")


# ----------------------------------------------------------------------------- the trainer


def routing_config(cfg: AutoResearchConfig) -> RoutingConfig:
    """Which groups are anchors. With debiasing on, a rho and min_groups that would leave no
    anchor group at all use one (the estimator needs pairs), with a warning."""
    c = cfg.correction
    share = c.uncertainty_share if cfg.routing == "uncertainty" else 0.0
    n = cfg.rl.groups()
    if cfg.mode == "real":
        return RoutingConfig(rho=1.0, min_groups=n, uncertainty_share=0.0)
    min_groups = c.min_groups
    spec = MODE_SPECS[cfg.mode]
    if spec.uses_wm and spec.debias and max(int(c.rho * n + 0.5), min_groups) == 0:
        warnings.warn(
            f"config.correction.rho={c.rho} with min_groups=0 leaves zero anchor groups per "
            f"step out of {n} while debiasing is on; using min_groups=1",
            stacklevel=4,
        )
        min_groups = 1
    return RoutingConfig(rho=c.rho, min_groups=min_groups, uncertainty_share=share)


def adaptive_rho_config(cfg: AutoResearchConfig) -> AdaptiveRhoConfig | None:
    """The fidelity-driven anchor fraction's rule (`correction.adaptive_rho`), None when off."""
    if not cfg.correction.adaptive_rho or cfg.mode == "real":
        return None
    return cfg.correction.adaptive_rho_config()


def max_anchor_groups(tc: TrainerConfig) -> int:
    """The most anchor groups a step can have: at the fixed `rho`, or at `rho_max` under the
    adaptive rule (what the static shapes of the pending anchors and of the jitted
    correction are sized to)."""
    routing = tc.routing
    if tc.adaptive_rho is not None:
        routing = dataclasses.replace(routing, rho=tc.adaptive_rho.rho_max)
    return int(num_anchor_groups(tc.groups, tc.groups, routing))


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The RL step's settings, typed and frozen, built once from the config. The anchor
    lag and the static check apply to modes with a WM stream only (`real` is synchronous
    GRPO on every group's real reward); multi-turn episodes (K > 1) are synchronous too (an
    anchor episode's later turns need its earlier turns' real observations)."""

    mode: str
    spec: ModeSpec
    seed: int
    groups: int  # B groups (tasks) per step
    group_size: int  # G samples per task
    prompt_len: int  # P
    new_tokens: int  # N
    turns: int  # K scripts per episode (env.turns; 1 = single-turn)
    anchor_lag: int  # 0 or 1
    static_check: str  # one of wmrl.experiment.sections.STATIC_CHECKS
    temperature: float
    normalize_std: bool
    baseline: str
    std_eps: float  # added to a group's std when normalize_std
    eval_samples: int
    learning_rate: float
    wm_learning_rate: float  # the WM's online fine-tuning
    wm_online_steps: int
    wm_batch_size: int
    wm_members: int
    replay_size: int
    wm_head_coefs: dict  # the observation heads' loss weights (`models.head_coefs`)
    time_limit_cap_s: float  # suite.time_limit_s: caps each task's limit (0 = none)
    fuse: bool  # the WM members fused by inverse variance (else their mean)
    routing: RoutingConfig
    debias: DebiasConfig
    denoise: DenoiseConfig
    # The fidelity-driven anchor fraction (`correction.adaptive_rho`); None = `routing.rho`.
    adaptive_rho: AdaptiveRhoConfig | None = None
    # Cost-aware routing's cap (`routing = cost`); None = only the anchors execute.
    cheap: CheapConfig | None = None


def trainer_config(config) -> TrainerConfig:
    """The RL step's settings from a config (a ConfigDict, or the typed config)."""
    cfg = parse_config(config)
    spec = MODE_SPECS[cfg.mode]
    rl, wm = cfg.rl, cfg.wm
    return TrainerConfig(
        mode=cfg.mode, spec=spec, seed=rl_seed(cfg), groups=rl.groups(),
        group_size=rl.group_size, prompt_len=cfg.data.max_prompt_len,
        new_tokens=cfg.data.max_new_tokens, turns=cfg.env.turns,
        anchor_lag=int(rl.anchor_lag) if spec.uses_wm else 0,
        static_check=rl.static_check if spec.uses_wm else "off",
        temperature=rl.temperature, normalize_std=rl.normalize_std, baseline=rl.baseline,
        std_eps=rl.std_eps, eval_samples=rl.eval_samples, learning_rate=rl.learning_rate,
        wm_learning_rate=wm.online_learning_rate, wm_online_steps=wm.online_steps,
        wm_batch_size=wm.batch_size, wm_members=wm.num_members, replay_size=wm.replay_size,
        wm_head_coefs={k: float(getattr(wm, k)) for k in ("runtime_coef", "error_type_coef",
                                                          "validation_coef")},
        time_limit_cap_s=cfg.suite.time_limit_s,
        fuse=resolve_fusion(cfg.correction.sample_fusion, spec),
        routing=routing_config(cfg), debias=cfg.correction.debias_config("monotone"),
        denoise=cfg.correction.denoise_config(), adaptive_rho=adaptive_rho_config(cfg),
        cheap=cheap_config(cfg),
    )  # fmt: skip


def cheap_config(cfg: AutoResearchConfig) -> CheapConfig | None:
    """Cost-aware routing's cap (`routing = cost`), None without it."""
    if cfg.routing != "cost":
        return None
    c = cfg.correction
    return CheapConfig(limit_s=c.cheap_limit_s, quantile=c.cheap_quantile)
