"""What each mode turns on, config validation, and the resume-compatibility check.

Every error names the config field. Validation runs before anything is written or any
device memory is allocated.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import warnings
from pathlib import Path

from wmrl import storage
from wmrl.config_errors import ConfigError
from wmrl.core.debias import DebiasConfig
from wmrl.core.denoise import DenoiseConfig
from wmrl.core.routing import RoutingConfig

MODES = ("real", "wm_only", "debias_only", "denoise_only", "wmrl")
ROUTINGS = ("uniform", "uncertainty")
# rl.static_check: which outcomes the WM stream takes from a static check instead of the WM
# (off; compile: MALFORMED; names: also RUNTIME_ERROR for a name read but never defined).
STATIC_CHECKS = ("off", "compile", "names")


@dataclasses.dataclass(frozen=True)
class ModeSpec:
    """`real`: every group executed, no WM (standard GRPO). The others execute only the anchor
    groups (same routing for all, so ablations differ only in the corrections) and fine-tune
    the WM on them; WM groups get the WM score, raw or calibrated."""

    uses_wm: bool
    debias: bool
    denoise: bool


MODE_SPECS = {
    "real": ModeSpec(uses_wm=False, debias=False, denoise=False),
    "wm_only": ModeSpec(uses_wm=True, debias=False, denoise=False),
    "debias_only": ModeSpec(uses_wm=True, debias=True, denoise=False),
    "denoise_only": ModeSpec(uses_wm=True, debias=False, denoise=True),
    "wmrl": ModeSpec(uses_wm=True, debias=True, denoise=True),
}

# Fields that may change between a run and its resumption (they do not change what a
# completed step computed). Everything else must match the saved config.json.
RESUMABLE_FIELDS = (
    "rl.steps", "rl.max_wall_time_s", "rl.eval_every", "rl.eval_every_s", "rl.eval_at_s",
    "rl.checkpoint_every", "rl.keep_checkpoints",
)  # fmt: skip


def load_config_file(path: str | Path):
    """`get_config()` of a config file, loaded by path (config files are not a package)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"wmrl_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


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


def groups_per_step(config) -> int:
    """B: `rl.batch_size // rl.group_size` when a batch size is given, else `rl.tasks_per_step`."""
    if config.rl.get("batch_size", 0):
        return config.rl.batch_size // config.rl.group_size
    return config.rl.tasks_per_step


def validate_autoresearch_config(config) -> None:
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
    if config.rl.group_size < 2:
        raise ConfigError("config.rl.group_size", "GRPO needs groups of at least 2 samples")
    bs = config.rl.get("batch_size", 0)
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
    if config.rl.eval_samples < 1:
        raise ConfigError("config.rl.eval_samples", "must be >= 1")
    if "eval_every_s" in config.rl:
        _positive(config, "rl.eval_every_s", 0)
    _check_eval_points(config.rl.get("eval_at_s", ()))
    lag = config.rl.get("anchor_lag", 0)
    if lag not in (0, 1) or isinstance(lag, bool):
        raise ConfigError(
            "config.rl.anchor_lag",
            f"must be 0 (anchors trained on in the step that sampled them) or 1 (one step "
            f"later, executing meanwhile), got {lag!r}",
        )
    if config.rl.get("static_check", "off") not in STATIC_CHECKS:
        raise ConfigError(
            "config.rl.static_check",
            f"must be one of {', '.join(STATIC_CHECKS)}, got {config.rl.static_check!r}",
        )
    micro = config.rl.get("num_micro_batches", 1)
    rows = groups_per_step(config) * config.rl.group_size
    if not isinstance(micro, int) or micro < 1 or rows % micro:
        raise ConfigError(
            "config.rl.num_micro_batches",
            f"must be a positive divisor of the {rows} trajectories per step, got {micro!r}",
        )
    from wmrl.envs.autoresearch.executor import validate_suite_executor

    validate_suite_executor(config.suite, reachable=True)  # executor, ray_address, mixed isolation
    storage.require_local(config.get("data_dir", ""), "data_dir")
    storage.require_local(config.suite.dir, "suite.dir")
    if config.suite.dir:
        if not (Path(config.suite.dir) / "suite.json").exists():
            raise ConfigError(
                "config.suite.dir",
                f"{config.suite.dir!r} is not a task suite (no suite.json); build one with "
                "`python -m wmrl.envs.autoresearch.suite --out=DIR` or leave it empty",
            )
    else:
        from wmrl.envs.autoresearch.suite import suite_tasks

        known = {t.id: t.split for t in suite_tasks()}
        unknown = [t for t in config.suite.tasks if t not in known]
        if unknown:
            raise ConfigError("config.suite.tasks", f"unknown built-in task ids {unknown}")
        splits = {known[t] for t in config.suite.tasks}
        for split in ("train", "heldout"):
            if split not in splits:
                raise ConfigError("config.suite.tasks", f"needs at least one {split} task")
    from wmrl.rl import pretrained

    pretrained.validate(config, config.data.max_prompt_len + config.data.max_new_tokens)
    try:
        routing_config(config)
        debias_config(config)
        denoise_config(config)
    except ValueError as e:
        raise ConfigError("config.correction", str(e)) from e
    spec = MODE_SPECS[config.mode]
    if spec.uses_wm and spec.debias:
        n = groups_per_step(config)
        rho = config.correction.rho
        if max(int(rho * n + 0.5), config.correction.min_groups) == 0:
            warnings.warn(
                f"config.correction.rho={rho} with min_groups=0 leaves zero anchor groups per "
                f"step out of {n} while debiasing is on; using min_groups=1",
                stacklevel=2,
            )
            config.correction.min_groups = 1


def routing_config(config) -> RoutingConfig:
    c = config.correction
    share = c.uncertainty_share if config.routing == "uncertainty" else 0.0
    if config.mode == "real":
        return RoutingConfig(rho=1.0, min_groups=groups_per_step(config), uncertainty_share=0.0)
    return RoutingConfig(rho=c.rho, min_groups=c.min_groups, uncertainty_share=share)


def debias_config(config) -> DebiasConfig:
    c = config.correction
    return DebiasConfig(
        mode="monotone",
        capacity=c.capacity,
        num_bins=c.num_bins,
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


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_differences(saved: dict, config) -> list[str]:
    """Fields (dotted) whose values differ between a saved config.json and `config` (a
    ConfigDict or a plain dict), ignoring those a resumed run may change."""
    now = _flatten(config if isinstance(config, dict) else json.loads(config.to_json_best_effort()))
    before = _flatten(saved)
    norm = lambda v: list(v) if isinstance(v, tuple) else v
    keys = sorted(set(now) | set(before))
    return [
        k
        for k in keys
        if k not in RESUMABLE_FIELDS
        and norm(now.get(k, "<absent>")) != norm(before.get(k, "<absent>"))
    ]
