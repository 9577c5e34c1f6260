"""The AutoResearch config: its schema, validation, the trainer's typed view, and resumes.

Defaults live in the config files only (`configs/autoresearch_tiny.py` is the schema every
AutoResearch config extends): a field missing from a config, or one the schema does not
know, is an error naming it. `validate_autoresearch_config` checks a ConfigDict without
changing it and returns `TrainerConfig`, the frozen, typed settings of the RL step built
once from it. Every error names the config field. Validation runs before anything is written
or any device memory is allocated.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import warnings
from pathlib import Path

from wmrl import storage
from wmrl.config_errors import ConfigError
from wmrl.core.correct import MODE_SPECS, MODES, SAMPLE_FUSIONS, ModeSpec, resolve_fusion
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.fidelity import AdaptiveRhoConfig
from wmrl.core.routing import RoutingConfig, num_anchor_groups

ROUTINGS = ("uniform", "uncertainty")
# rl.static_check: which outcomes the WM stream takes from a static check instead of the WM
# (off; compile: MALFORMED; names: also RUNTIME_ERROR for a name read but never defined).
STATIC_CHECKS = ("off", "compile", "names")

# The config file whose fields every AutoResearch config has (their defaults), and the
# sections a config may add to it (the pod configs spell the model and mesh out).
SCHEMA_FILE = Path(__file__).resolve().parents[2] / "configs" / "autoresearch_tiny.py"
OPTIONAL_FIELDS = ("model", "mesh_shape")

# Fields that may change between a run and its resumption (they do not change what a
# completed step computed). Everything else must match the saved config.json.
# Fields added after runs were written, with the value that reproduces what those runs did:
# a saved config (or stage fingerprint) without one is compared as if it had that value.
# (`env`: a run or stage saved before multi-turn episodes existed was single-turn.)
LEGACY_DEFAULTS = {
    "wm.runtime_coef": 0.0, "wm.error_type_coef": 0.0, "wm.validation_coef": 0.0,
    "correction.adaptive_rho": False, "correction.rho_min": 0.125, "correction.rho_max": 1.0,
    "env.turns": 1, "env.sft_episodes_per_task": 4, "rl.seed": -1,
    "wm.policy_samples_per_task": 0, "wm.policy_validation_every": 4,
    "wm.seed": -1, "wm.pretrain_eval_every": 0, "wm.pretrain_patience": 5, "wm.kind": "neural",
    # Runs before the field fused the WM members by inverse variance in every mode.
    "correction.sample_fusion": "inverse_variance",
}  # fmt: skip

RESUMABLE_FIELDS = (
    "rl.steps", "rl.max_wall_time_s", "rl.eval_every", "rl.eval_every_s", "rl.eval_at_s",
    "rl.checkpoint_every", "rl.keep_checkpoints",
)  # fmt: skip


def load_config_file(path: str | Path, *args):
    """`get_config(*args)` of a config file, loaded by path (config files are not a
    package)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"wmrl_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*args)


def config_field(config, field: str):
    """The value of a dotted field (`"rl.steps"`) of a ConfigDict or dict."""
    node = config
    for part in field.split("."):
        node = node[part]
    return node


def _positive(config, field: str, minimum: float = 1) -> None:
    v = config_field(config, field)
    if not isinstance(v, int | float) or isinstance(v, bool) or v < minimum:
        raise ConfigError(f"config.{field}", f"must be a number >= {minimum}, got {v!r}")


def _finite(config, field: str, *, above: float | None = None, least: float | None = None):
    """A real, finite number, `> above` or `>= least`."""
    v = config_field(config, field)
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (above is None or v > above) and (least is None or v >= least)
    if not ok:
        bound = f"> {above}" if above is not None else f">= {least}" if least is not None else ""
        raise ConfigError(f"config.{field}", f"must be a finite number {bound}, got {v!r}")


def check_schema(config, schema=None) -> None:
    """Every field of the schema config is present and no other (but `OPTIONAL_FIELDS`):
    a misspelt field would otherwise be ignored, a missing one fail deep in the run."""
    if schema is None:
        if not SCHEMA_FILE.exists():  # an installed package without the configs folder
            return
        schema = load_config_file(SCHEMA_FILE)
    want = set(_flatten(schema.to_dict()))
    have = set(_flatten(config.to_dict() if hasattr(config, "to_dict") else dict(config)))
    optional = lambda k: k.split(".")[0] in OPTIONAL_FIELDS
    unknown = sorted(k for k in have - want if not optional(k))
    if unknown:
        raise ConfigError(
            f"config.{unknown[0]}",
            f"unknown field (not in {SCHEMA_FILE.name}); unknown: {', '.join(unknown)}",
        )
    missing = sorted(want - have)
    if missing:
        raise ConfigError(
            f"config.{missing[0]}",
            f"missing (every field has its default in {SCHEMA_FILE.name}); missing: "
            f"{', '.join(missing)}",
        )


def _check_eval_points(points) -> None:
    """`rl.eval_at_s`: training wall-clock points (s), positive and increasing."""
    field = "config.rl.eval_at_s"
    if not isinstance(points, tuple | list):
        raise ConfigError(field, f"must be a tuple of wall-clock seconds, got {points!r}")
    for i, p in enumerate(points):
        if not isinstance(p, int | float) or isinstance(p, bool) or not p > 0:
            raise ConfigError(field, f"point {i} must be a number > 0 (seconds), got {p!r}")
        if i and p <= points[i - 1]:
            raise ConfigError(
                field, f"points must increase: point {i} ({p!r}) <= point {i - 1} "
                f"({points[i - 1]!r})",
            )  # fmt: skip


def rl_seed(config) -> int:
    """The RL run's seed (`rl.seed`, or `seed` when it is -1): policy sampling, task order,
    routing, the WM's online updates and the sandbox executions. The stages before RL (data,
    warm start, WM pretraining) use `seed`, so runs that differ only in `rl.seed` share them
    (the speedup benchmark's `--seeds`)."""
    s = config.rl.seed
    return config.seed if s == -1 else s


def groups_per_step(config) -> int:
    """B: `rl.batch_size // rl.group_size` when a batch size is given, else `rl.tasks_per_step`."""
    if config.rl.batch_size:
        return config.rl.batch_size // config.rl.group_size
    return config.rl.tasks_per_step


def validate_autoresearch_config(config) -> TrainerConfig:
    """Check `config` (unchanged) and return the trainer's typed settings built from it."""
    check_schema(config)
    _check_fields(config)
    _check_turns(config)
    _check_numbers(config)
    _check_adaptive_rho(config)
    _check_suite(config)
    from wmrl.autoresearch import pretrained

    pretrained.validate(config, config.data.max_prompt_len + config.data.max_new_tokens)
    try:
        return trainer_config(config)
    except ValueError as e:
        raise ConfigError("config.correction", str(e)) from e


def _check_numbers(config) -> None:
    """Real-valued knobs (NaN and infinities included) and layer counts."""
    for field in (
        "rl.learning_rate",
        "rl.temperature",
        "suite.time_limit_s",
        "wm.learning_rate",
        "wm.online_learning_rate",
        "policy.sft_learning_rate",
    ):
        _finite(config, field, above=0)  # fmt: skip
    _check_time_limit_cap(config.suite.time_limit_s)
    for field in ("rl.clip_eps", "rl.kl_coef", "rl.max_wall_time_s", "rl.entropy_coef",
                  "wm.rank_coef", "wm.runtime_coef", "wm.error_type_coef",
                  "wm.validation_coef", "correction.min_slope"):  # fmt: skip
        _finite(config, field, least=0)
    _finite(config, "rl.std_eps", above=0)
    for field, high in (("correction.rho", 1.0), ("correction.min_slope", 0.999999)):
        if not config_field(config, field) <= high:
            raise ConfigError(f"config.{field}", f"must be <= {high}, got "
                              f"{config_field(config, field)!r}")  # fmt: skip
    _finite(config, "correction.rho", least=0)
    _positive(config, "wm.group_rows")
    _positive(config, "wm.validation_every", 0)
    _check_policy_samples(config)
    _check_wm_pretraining(config)
    if config.correction.sample_fusion not in SAMPLE_FUSIONS:
        raise ConfigError(
            "config.correction.sample_fusion",
            f"must be one of {SAMPLE_FUSIONS}, got {config.correction.sample_fusion!r}",
        )
    spacing = config.correction.bin_spacing
    if spacing not in ("equal_width", "equal_mass"):
        raise ConfigError(
            "config.correction.bin_spacing",
            f"unknown bin spacing {spacing!r}; one of ('equal_width', 'equal_mass')",
        )
    for field in (
        "policy.num_layers",
        "policy.d_model",
        "policy.mlp_dim",
        "policy.head_dim",
        "wm.num_layers",
        "wm.d_model",
        "wm.mlp_dim",
        "wm.head_dim",
    ):
        _positive(config, field)  # fmt: skip
    cores = os.cpu_count() or 1
    if config.suite.workers > cores:
        warnings.warn(
            f"config.suite.workers={config.suite.workers} is above the {cores} CPU cores of "
            "this machine: the sandboxes will share cores and every execution will run slower",
            stacklevel=3,
        )


def _check_time_limit_cap(cap) -> None:
    """`suite.time_limit_s` caps each task's time limit: no higher than a task's own bound
    (`task.MAX_TIME_LIMIT_S`, a day), past which the sandbox's waits no longer fit."""
    from wmrl.autoresearch.env.task import MAX_TIME_LIMIT_S

    if cap > MAX_TIME_LIMIT_S:
        raise ConfigError(
            "config.suite.time_limit_s",
            f"must be at most {MAX_TIME_LIMIT_S:g} s (a day: the longest time limit a task may "
            f"have), got {cap!r}",
        )


def _check_policy_samples(config) -> None:
    """`wm.policy_samples_per_task` and `wm.policy_validation_every`: integers >= 0; policy
    samples are single-turn scripts (a multi-turn WM is pretrained on executed episodes)."""
    for field in ("wm.policy_samples_per_task", "wm.policy_validation_every"):
        v = config_field(config, field)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ConfigError(f"config.{field}", f"must be an integer >= 0, got {v!r}")
    if config.wm.policy_samples_per_task and config.env.turns > 1:
        raise ConfigError(
            "config.wm.policy_samples_per_task",
            f"policy samples are single-turn scripts; with env.turns={config.env.turns} use 0",
        )


def _check_wm_pretraining(config) -> None:
    """`wm.kind`: one of `WM_KINDS` ("features": single-turn only); `wm.seed`: an integer
    >= -1 (-1 = `seed` + 1); `wm.pretrain_eval_every`: an integer >= 0 (0 = a fixed step
    count); `wm.pretrain_patience`: an integer >= 1."""
    from wmrl.autoresearch.feature_wm import WM_KINDS

    kind = config.wm.kind
    if kind not in WM_KINDS:
        raise ConfigError("config.wm.kind", f"must be one of {WM_KINDS}, got {kind!r}")
    if kind == "features" and config.env.turns > 1:
        raise ConfigError(
            "config.wm.kind",
            f"'features' scores single scripts; env.turns={config.env.turns} needs the neural "
            "WM, which also predicts each turn's observation",
        )
    for field, least in (("wm.seed", -1), ("wm.pretrain_eval_every", 0),
                         ("wm.pretrain_patience", 1)):  # fmt: skip
        v = config_field(config, field)
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise ConfigError(f"config.{field}", f"must be an integer >= {least}, got {v!r}")


def _check_adaptive_rho(config) -> None:
    """`correction.adaptive_rho`, `rho_min`, `rho_max` (docs/method.md 3.10): fractions in [0, 1],
    `rho_min <= rho_max` (checked whether or not the rule is on), and the rule only where a
    WM stream is measured and may be thinned."""
    c = config.correction
    for field in ("correction.rho_min", "correction.rho_max"):
        v = config_field(config, field)
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0.0 <= v <= 1.0:
            raise ConfigError(f"config.{field}", f"must be an anchor fraction in [0, 1], got {v!r}")
    if c.rho_min > c.rho_max:
        raise ConfigError(
            "config.correction.rho_min",
            f"({c.rho_min!r}) must be <= config.correction.rho_max ({c.rho_max!r})",
        )
    if not isinstance(c.adaptive_rho, bool):
        raise ConfigError(
            "config.correction.adaptive_rho", f"must be True or False, got {c.adaptive_rho!r}"
        )
    if not c.adaptive_rho:
        return
    spec = MODE_SPECS[config.mode]
    if not spec.uses_wm:
        raise ConfigError(
            "config.correction.adaptive_rho",
            f"mode {config.mode!r} has no WM stream to measure (it executes every group); "
            "use a mode with a world model or adaptive_rho=False",
        )
    if spec.constant:
        raise ConfigError(
            "config.correction.adaptive_rho",
            f"the control {config.mode!r} keeps a fixed anchor fraction (correction.rho): it "
            "is the plain verifiers + anchors baseline; use adaptive_rho=False",
        )
    if not c.rho_min <= c.rho <= c.rho_max:
        raise ConfigError(
            "config.correction.rho",
            f"({c.rho!r}) is the anchor fraction before the adaptive rule has measured the WM; "
            f"with adaptive_rho it must lie in [correction.rho_min, correction.rho_max] = "
            f"[{c.rho_min!r}, {c.rho_max!r}]",
        )
    n = groups_per_step(config)
    if max(math.floor(c.rho_min * n + 0.5), c.min_groups) < 1:
        raise ConfigError(
            "config.correction.rho_min",
            f"({c.rho_min!r}) with correction.min_groups=0 gives steps with no anchor group out "
            f"of {n}: the adaptive rule could never measure the WM again; raise it or "
            "min_groups",
        )


def _check_fields(config) -> None:
    if config.mode not in MODES:
        raise ConfigError("config.mode", f"unknown mode {config.mode!r}; one of {MODES}")
    if config.routing not in ROUTINGS:
        raise ConfigError(
            "config.routing", f"unknown routing {config.routing!r}; one of {ROUTINGS}"
        )
    for field in (
        "rl.steps", "rl.tasks_per_step", "rl.group_size", "rl.eval_every", "rl.eval_samples",
        "rl.checkpoint_every", "rl.keep_checkpoints", "data.scripts_per_task",
        "data.max_prompt_len", "data.max_new_tokens", "data.vocab_size", "policy.sft_batch_size",
        "wm.batch_size", "wm.num_members", "wm.replay_size", "suite.workers",
    ):  # fmt: skip
        _positive(config, field)
    for field in (
        "policy.sft_steps",
        "wm.pretrain_steps",
        "wm.online_steps",
        "data.sft_scripts_per_task",
    ):
        _positive(config, field, 0)
    held = config.data.heldout_scripts_per_task
    if not isinstance(held, int) or isinstance(held, bool) or not (held == -1 or held >= 1):
        raise ConfigError(
            "config.data.heldout_scripts_per_task",
            f"must be -1 (as data.scripts_per_task) or an integer >= 1, got {held!r}",
        )
    if config.rl.group_size < 2:
        raise ConfigError("config.rl.group_size", "GRPO needs groups of at least 2 samples")
    bs = config.rl.batch_size
    if bs and (bs < 0 or bs % config.rl.group_size != 0):
        raise ConfigError(
            "config.rl.batch_size",
            f"{bs} trajectories do not divide into groups of rl.group_size="
            f"{config.rl.group_size}; group size is a static shape, never reshaped silently",
        )
    if config.rl.baseline not in ("mean", "rloo"):
        raise ConfigError(
            "config.rl.baseline", f"must be 'mean' or 'rloo', got {config.rl.baseline!r}"
        )
    s = config.rl.seed
    if not isinstance(s, int) or isinstance(s, bool) or s < -1:
        raise ConfigError(
            "config.rl.seed", f"must be an integer >= 0, or -1 (= config.seed), got {s!r}"
        )
    if config.rl.eval_samples < 1:
        raise ConfigError("config.rl.eval_samples", "must be >= 1")
    _finite(config, "rl.eval_every_s", least=0)
    _check_eval_points(config.rl.eval_at_s)
    lag = config.rl.anchor_lag
    if lag not in (0, 1) or isinstance(lag, bool):
        raise ConfigError(
            "config.rl.anchor_lag",
            f"must be 0 (anchors trained on in the step that sampled them) or 1 (one step "
            f"later, executing meanwhile), got {lag!r}",
        )
    if config.rl.static_check not in STATIC_CHECKS:
        raise ConfigError(
            "config.rl.static_check",
            f"must be one of {', '.join(STATIC_CHECKS)}, got {config.rl.static_check!r}",
        )
    micro = config.rl.num_micro_batches
    rows = groups_per_step(config) * config.rl.group_size
    if not isinstance(micro, int) or micro < 1 or rows % micro:
        raise ConfigError(
            "config.rl.num_micro_batches",
            f"must be a positive divisor of the {rows} trajectories per step, got {micro!r}",
        )


def _check_turns(config) -> None:
    """`env.turns` (K >= 1) and, for K > 1, a prompt budget that holds one turn's history."""
    from wmrl.autoresearch.history import min_prompt_len

    turns = config.env.turns
    if not isinstance(turns, int) or isinstance(turns, bool) or turns < 1:
        raise ConfigError(
            "config.env.turns", f"must be an integer >= 1 (scripts per episode), got {turns!r}"
        )
    _positive(config, "env.sft_episodes_per_task", 0)
    if turns > 1 and config.rl.anchor_lag:
        raise ConfigError(
            "config.rl.anchor_lag",
            f"must be 0 with env.turns={turns}: an anchor episode's next turn is written from its "
            "real observation, so its executions cannot run a step behind",
        )
    need = min_prompt_len(config.data.max_new_tokens)
    if turns > 1 and config.data.max_prompt_len < need:
        raise ConfigError(
            "config.data.max_prompt_len",
            f"{config.data.max_prompt_len} tokens cannot hold one turn's history with "
            f"env.turns={turns}: the card, the last script (data.max_new_tokens="
            f"{config.data.max_new_tokens}) and its observation need >= {need}",
        )


def _check_suite(config) -> None:
    from wmrl.autoresearch.env.executor import validate_suite_executor

    validate_suite_executor(config.suite, reachable=True)  # executor, ray_address, mixed isolation
    storage.require_local(config.data_dir, "data_dir")
    storage.require_local(config.suite.dir, "suite.dir")
    if config.suite.dir:
        if not (Path(config.suite.dir) / "suite.json").exists():
            raise ConfigError(
                "config.suite.dir",
                f"{config.suite.dir!r} is not a task suite (no suite.json); build one with "
                "`python -m wmrl.autoresearch.env.suite --out=DIR` or leave it empty",
            )
    else:
        from wmrl.autoresearch.env.suite import suite_tasks

        known = {t.id: t.split for t in suite_tasks()}
        unknown = [t for t in config.suite.tasks if t not in known]
        if unknown:
            raise ConfigError("config.suite.tasks", f"unknown built-in task ids {unknown}")
        splits = {known[t] for t in config.suite.tasks}
        for split in ("train", "heldout"):
            if split not in splits:
                raise ConfigError("config.suite.tasks", f"needs at least one {split} task")


def routing_config(config) -> RoutingConfig:
    """Which groups are anchors. With debiasing on, a rho and min_groups that would leave no
    anchor group at all use one (the estimator needs pairs), with a warning."""
    c = config.correction
    share = c.uncertainty_share if config.routing == "uncertainty" else 0.0
    n = groups_per_step(config)
    if config.mode == "real":
        return RoutingConfig(rho=1.0, min_groups=n, uncertainty_share=0.0)
    min_groups = c.min_groups
    spec = MODE_SPECS[config.mode]
    if spec.uses_wm and spec.debias and max(int(c.rho * n + 0.5), min_groups) == 0:
        warnings.warn(
            f"config.correction.rho={c.rho} with min_groups=0 leaves zero anchor groups per "
            f"step out of {n} while debiasing is on; using min_groups=1",
            stacklevel=3,
        )
        min_groups = 1
    return RoutingConfig(rho=c.rho, min_groups=min_groups, uncertainty_share=share)


def adaptive_rho_config(config) -> AdaptiveRhoConfig | None:
    """The fidelity-driven anchor fraction's rule (`correction.adaptive_rho`), None when off.
    Its agreement levels, half-life and warm-up are `AdaptiveRhoConfig`'s."""
    c = config.correction
    if not c.adaptive_rho or config.mode == "real":
        return None
    return AdaptiveRhoConfig(rho=c.rho, rho_min=c.rho_min, rho_max=c.rho_max)


def max_anchor_groups(tc: TrainerConfig) -> int:
    """The most anchor groups a step can have: at the fixed `rho`, or at `rho_max` under the
    adaptive rule (what the static shapes of the pending anchors and of the jitted
    correction are sized to)."""
    routing = tc.routing
    if tc.adaptive_rho is not None:
        routing = dataclasses.replace(routing, rho=tc.adaptive_rho.rho_max)
    return int(num_anchor_groups(tc.groups, tc.groups, routing))


def debias_config(config) -> DebiasConfig:
    c = config.correction
    return DebiasConfig(
        mode="monotone",
        capacity=c.capacity,
        num_bins=c.num_bins,
        bin_spacing=c.bin_spacing,
        min_slope=c.min_slope,
        min_pairs=c.min_pairs,
        refit_every=c.refit_every,
        reward_range=(0.0, 1.0),
    )


def denoise_config(config) -> DenoiseConfig:
    c = config.correction
    return DenoiseConfig(
        half_life=c.denoise_half_life,
        warmup_groups=c.denoise_warmup_groups,
        target=c.denoise_target,
        w_max=c.denoise_w_max,
    )


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """The RL step's settings, typed and frozen, built once from the ConfigDict. The anchor
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
    static_check: str  # one of STATIC_CHECKS
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


def trainer_config(config) -> TrainerConfig:
    spec = MODE_SPECS[config.mode]
    rl, wm = config.rl, config.wm
    return TrainerConfig(
        mode=config.mode, spec=spec, seed=rl_seed(config), groups=groups_per_step(config),
        group_size=rl.group_size, prompt_len=config.data.max_prompt_len,
        new_tokens=config.data.max_new_tokens, turns=config.env.turns,
        anchor_lag=int(rl.anchor_lag) if spec.uses_wm else 0,
        static_check=rl.static_check if spec.uses_wm else "off",
        temperature=rl.temperature, normalize_std=rl.normalize_std, baseline=rl.baseline,
        std_eps=rl.std_eps, eval_samples=rl.eval_samples, learning_rate=rl.learning_rate,
        wm_learning_rate=wm.online_learning_rate, wm_online_steps=wm.online_steps,
        wm_batch_size=wm.batch_size, wm_members=wm.num_members, replay_size=wm.replay_size,
        wm_head_coefs={k: float(wm[k]) for k in ("runtime_coef", "error_type_coef",
                                                 "validation_coef")},
        time_limit_cap_s=config.suite.time_limit_s,
        fuse=resolve_fusion(config.correction.sample_fusion, spec),
        routing=routing_config(config), debias=debias_config(config),
        denoise=denoise_config(config), adaptive_rho=adaptive_rho_config(config),
    )  # fmt: skip


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def legacy_hint(saved: dict, diff: list[str]) -> str:
    """For differing fields that the saved config predates (`LEGACY_DEFAULTS`): how to
    resume it as it was (e.g. ` (written before wm.runtime_coef existed: pass
    --config.wm.runtime_coef=0.0 to continue it as it was)`); '' otherwise."""
    before = _flatten(saved)
    old = [k for k in diff if k in LEGACY_DEFAULTS and k not in before]
    if not old:
        return ""
    flags = " ".join(f"--config.{k}={LEGACY_DEFAULTS[k]}" for k in old)
    return f" (written before {', '.join(old)} existed: pass {flags} to continue it as it was)"


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


def config_differences(saved: dict, config) -> list[str]:
    """Fields (dotted) whose values differ between a saved config.json and `config` (a
    ConfigDict or a plain dict), ignoring those a resumed run may change."""
    now = _flatten(config if isinstance(config, dict) else json.loads(config.to_json_best_effort()))
    before = _flatten(saved)
    for k, v in LEGACY_DEFAULTS.items():
        if k in now:  # compare like with like: a fingerprint holds only its own fields
            before.setdefault(k, v)
    now, before = _resolved(now), _resolved(before)
    norm = lambda v: list(v) if isinstance(v, tuple) else v
    keys = sorted(set(now) | set(before))
    return [
        k
        for k in keys
        if k not in RESUMABLE_FIELDS
        and norm(now.get(k, "<absent>")) != norm(before.get(k, "<absent>"))
    ]
