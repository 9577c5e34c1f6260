"""The embodied config: its typed schema (every field's one default), validation, and how
saved runs and stages compare.

`EmbodiedConfig` is a tree of frozen sections (`wmrl.experiment.config`): the experiment's
own (`image`, `env`, `tasks`, `demos`, `policy`, `wm`) and the ones it shares with
AutoResearch (`rl`, extended by `EmbodiedRL`, and `correction`, `wmrl.experiment.sections`).
The scene's, the images' and the policy's defaults are their specs' (`env.EnvSpec`,
`render.ImageSpec`, `policy.PolicySpec`); configs/embodied_push.py sets the shared sections'
values this job needs. `defaults()` is the ConfigDict an embodied config file starts from.

A shared feature this experiment does not implement is refused by name rather than ignored:
the adaptive anchor fraction (`correction.adaptive_rho`), anchors trained on a step late
(`rl.anchor_lag`), uncertainty routing (`routing`), the static check (`rl.static_check`:
an episode has nothing to check statically) and greedy evaluation (`rl.eval_greedy`).
"""

from __future__ import annotations

from wmrl.config_errors import ConfigError
from wmrl.core.correct import MODE_SPECS, resolve_fusion
from wmrl.embodied.env import COLOURS, EnvSpec
from wmrl.embodied.policy import PolicySpec
from wmrl.embodied.render import ImageSpec
from wmrl.embodied.world_model import DYNAMICS, HEAD_WIDTHS
from wmrl.experiment import config as xconfig
from wmrl.experiment import renamed
from wmrl.experiment.config import ConfigHistory, Section, section, setting, subsection
from wmrl.experiment.sections import RENAMED_MODES, CorrectionConfig, RLConfig, RunConfig

OBSERVATIONS = ("state", "image")


@section
class ImageConfig(Section):
    """What the policy sees with obs = "image" (`render.ImageSpec`)."""

    pixels: int = setting(ImageSpec.pixels, low=1)  # side of each image (1.9 cm per pixel)
    patch: int = setting(ImageSpec.patch, low=1)  # side of a patch token (a strided conv)
    extent: float = setting(ImageSpec.extent, above=0.0)  # half-width of the drawn square (m)
    # FiLM: the instruction scales and shifts the patch embeddings (RT-1's conditioning)
    film: bool = ImageSpec.film
    # BC sees each demo step translated by up to this (m): DrQ's random shifts, in the world
    bc_shift: float = setting(ImageSpec.bc_shift, low=0.0)

    def check(self) -> None:
        if self.pixels % self.patch:
            raise ConfigError(
                "patch", f"must divide config.image.pixels={self.pixels}, got {self.patch}"
            )
        if not self.bc_shift < self.extent:
            raise ConfigError("bc_shift", f"must be in [0, image.extent) (m), got {self.bc_shift}")


@section
class SceneConfig(Section):
    """The tabletop scene (`config.env`, `env.EnvSpec`)."""

    colours: tuple[str, ...] = setting(COLOURS, choices=COLOURS)  # the scene's three blocks
    episode_len: int = setting(EnvSpec.episode_len, low=1)  # actions per episode (0.1 s each)
    action_bins: int = setting(EnvSpec.action_bins, low=1)  # per axis: bins ** 2 action tokens
    max_speed: float = setting(EnvSpec.max_speed, above=0.0)
    action_dt: float = setting(EnvSpec.action_dt, above=0.0)
    timestep: float = setting(EnvSpec.timestep, above=0.0)
    push_distance: float = setting(EnvSpec.push_distance, above=0.0)
    success_radius: float = setting(EnvSpec.success_radius, above=0.0)
    workspace: float = setting(EnvSpec.workspace, above=0.0)
    min_separation: float = setting(EnvSpec.min_separation, low=0.0)
    # Declared robot latency per real episode (modelled in summary.json only; nothing sleeps).
    real_episode_cost_s: float = setting(0.0, low=0.0)

    def check(self) -> None:
        if len(set(self.colours)) != 3 or len(self.colours) != 3:
            raise ConfigError(
                "colours", f"the scene has three blocks from {list(COLOURS)}, got {self.colours}"
            )


@section
class TasksConfig(Section):
    """Instructions: held out (unseen combinations: every colour and every direction is
    trained, not these) and trained (() = the other ones)."""

    heldout: tuple[str, ...] = (
        "push the red block back",
        "push the green block left",
        "push the blue block forward",
    )
    train: tuple[str, ...] = ()


@section
class DemosConfig(Section):
    """Expert demonstrations (the waypoint controller's real episodes)."""

    episodes: int = setting(240, low=1)
    successful_only: bool = True


@section
class EmbodiedPolicyConfig(Section):
    """The chunk policy (`policy.PolicySpec`) and its behaviour cloning."""

    chunk: int = setting(4, low=1)  # actions per policy call
    d_model: int = setting(PolicySpec.d_model, low=1)
    num_layers: int = setting(PolicySpec.num_layers, low=1)
    num_heads: int = setting(PolicySpec.num_heads, low=1)
    mlp_dim: int = setting(PolicySpec.mlp_dim, low=1)
    # Read the scene in the instruction's frame (a built-in rotation symmetry; docs/embodied.md)
    canonical_frame: bool = PolicySpec.canonical_frame
    bc_steps: int = setting(1500, low=0)
    bc_batch_size: int = setting(128, low=1)
    bc_learning_rate: float = setting(2e-3, above=0.0)


@section
class EmbodiedWMConfig(Section):
    """The world model: its dynamics and success head, pretraining, online fine-tuning."""

    num_members: int = setting(4, low=1)
    # Learned dynamics: object (a learned pusher map and one block MLP gated by the pusher's
    # swept path, trained under the square's symmetries) | mlp (one MLP of the whole state,
    # whose imagined blocks drift). The earlier runs used mlp with head_inputs="path",
    # unroll=1, batch_transitions=256, online_steps=4, correction.rho=0.25, rl.eval_every=5;
    # docs/embodied.md.
    dynamics: str = setting("object", choices=DYNAMICS)
    hidden: int = setting(128, low=1)
    head_hidden: int = setting(64, low=1)
    # What the success head reads: the imagined final state (final), + the imagined pusher
    # path (final+path), or the instruction and the path only (path; the best with the `mlp`
    # dynamics, whose imagined blocks drift); docs/embodied.md.
    head_inputs: str = setting("final", choices=tuple(HEAD_WIDTHS))
    # Contact gate of the `mlp` dynamics (m, 0 = off): an imagined block moves only while the
    # pusher or another block is this close (docs/results.md, imagination vs simulator). The
    # `object` dynamics gate by the pusher's swept path instead.
    contact_gate: float = setting(0.0, low=0.0, below=1.0, note="a distance in m, 0 = off")
    # Branched imagination (chunks, 0 = off): a WM group is G imagined branches of this many
    # chunks from one real state of the step's anchor episodes, scored by a success-to-go head
    # (MBPO's short model rollouts; docs/embodied.md). 0: whole episodes from a fresh start.
    branch_chunks: int = 0
    policy_rollouts: int = setting(192, low=0)  # real BC-policy episodes for WM pretraining
    pretrain_steps: int = setting(800, low=0)
    batch_transitions: int = setting(512, low=1)  # training windows per member and step
    # Actions per training window: the dynamics loss is a K-step open-loop unroll. With the
    # object dynamics K=4 keeps the pusher 1 mm off over an episode where K=1 drifts 6 mm (the
    # servo's lag telescopes over a window, not over one step); docs/results.md.
    unroll: int = setting(4, low=1)
    batch_episodes: int = setting(64, low=1)
    learning_rate: float = setting(1e-3, above=0.0)
    online_learning_rate: float = setting(3e-4, above=0.0)
    # Per RL step, on the replay of real episodes. 16 keeps the WM up with the policy: at 4 the
    # policy drifted into what the WM imagined wrong and `wmrl` fell back to 0.40 by step 40
    # on one seed (3 seeds: final 0.436 at 4, 0.473 at 16; docs/results.md).
    online_steps: int = setting(16, low=0)
    # Real episodes the WM trains on online (first in, first out; the demos and BC rollouts
    # come first). 256 (the latest only, after 32 steps just the anchors) removed the WM's
    # level bias but not its within-group order: final 0.471 vs 0.468 over 10 seeds, below
    # `real` on fresh ones (docs/results.md).
    replay_size: int = setting(2048, low=1)

    def check(self) -> None:
        if self.contact_gate > 0 and self.dynamics != "mlp":
            raise ConfigError(
                "contact_gate",
                f"applies to wm.dynamics='mlp' only (the {self.dynamics!r} dynamics gate every "
                "block by the pusher's swept path); set it to 0",
            )


@section
class EmbodiedRL(RLConfig):
    """`config.rl`: the shared GRPO fields and the embodied experiment's own."""

    ppo_epochs: int = setting(2, low=1)
    # Imagined episodes: train only the tokens emitted before the WM members first disagree by
    # this much (m, largest block std across members) on the state the policy read; 0 = all.
    wm_trust_spread: float = setting(0.0, low=0.0, note="a distance in m, 0 = off")
    eval_episodes: int = setting(300, low=1)  # held-out real episodes per evaluation
    # Evaluate by the policy's most likely actions. Not implemented: evaluation samples at
    # rl.temperature, and True is refused (`EmbodiedConfig`) rather than ignored.
    eval_greedy: bool = False


@section
class EmbodiedConfig(RunConfig):
    """Every field of an embodied run (configs/embodied_push.py)."""

    experiment: str = setting("embodied", choices=("embodied",))
    # state: the policy reads the objects' xy. image (VLA-style): it sees the blocks only in
    # two top-down RGB images drawn from the state (first frame, current frame; `image`)
    # plus the pusher's own xy. The world model imagines states either way.
    obs: str = setting("state", choices=OBSERVATIONS)
    # Held-out success that defines real_executions_to_target (warm start 0.363; `real` reached
    # it in 384, 256 and 640 real executions on three seeds, docs/results.md).
    target_success: float = 0.45
    image: ImageConfig = subsection(ImageConfig)  # read only with obs = "image"
    env: SceneConfig = subsection(SceneConfig)
    tasks: TasksConfig = subsection(TasksConfig)
    demos: DemosConfig = subsection(DemosConfig)
    policy: EmbodiedPolicyConfig = subsection(EmbodiedPolicyConfig)
    wm: EmbodiedWMConfig = subsection(EmbodiedWMConfig)
    rl: EmbodiedRL = subsection(EmbodiedRL)
    correction: CorrectionConfig = subsection(CorrectionConfig)

    def check(self) -> None:
        super().check()
        T, H = self.env.episode_len, self.policy.chunk
        if H > T:
            raise ConfigError(
                "policy.chunk",
                f"an action chunk of {H} is longer than the episode ({T} actions, "
                "config.env.episode_len)",
            )
        if T % H:
            raise ConfigError("policy.chunk", f"must divide env.episode_len={T}, got {H}")
        if not 0 <= self.wm.branch_chunks <= T // H:
            raise ConfigError(
                "wm.branch_chunks",
                f"chunks per imagined branch, an integer in [0, {T // H}] (the episode's "
                f"chunks; 0 = whole imagined episodes), got {self.wm.branch_chunks!r}",
            )
        self._refuse_what_does_not_run_here()

    def _refuse_what_does_not_run_here(self) -> None:
        """Shared settings of features this experiment does not implement."""
        if self.correction.adaptive_rho:
            raise ConfigError(
                "correction.adaptive_rho",
                "the adaptive anchor fraction is not implemented in the embodied experiment "
                "(the anchor fraction is correction.rho); use False",
            )
        if self.rl.anchor_lag:
            raise ConfigError(
                "rl.anchor_lag",
                "must be 0 in the embodied experiment: anchor episodes are trained on in the "
                "step that sampled them (a one-step lag is not implemented here)",
            )
        if self.routing != "uniform":
            raise ConfigError(
                "routing",
                f"{self.routing!r} routing is not implemented in the embodied experiment; use "
                "'uniform'",
            )
        for name in ("cheap_limit_s", "cheap_quantile"):
            if getattr(self.correction, name):
                raise ConfigError(
                    f"correction.{name}",
                    "the cap of cost-aware routing is not implemented in the embodied "
                    "experiment (simulated rollouts are cheap); use 0",
                )
        if self.rl.eval_greedy:
            raise ConfigError(
                "rl.eval_greedy",
                "greedy evaluation is not implemented in the embodied experiment (held-out "
                "episodes sample at rl.temperature, as training does); use False",
            )
        if self.rl.static_check != "off":
            raise ConfigError(
                "rl.static_check",
                "must be 'off' in the embodied experiment: an action sequence has no static "
                "check (a script's compile or name check has no counterpart here)",
            )


# ----------------------------------------------------------------------------- saved runs


def _resolved(flat: dict) -> dict:
    """Compared by what a field does: the control under its old name as the control;
    `correction.sample_fusion` resolved for the mode (a run saved with `auto` resumes under
    the value `auto` resolves to); `image.*` only where the policy reads images (a state run,
    saved before the fields or not, ignores them)."""
    if flat.get("mode") in RENAMED_MODES:
        flat = {**flat, "mode": RENAMED_MODES[flat["mode"]]}
    if flat.get("obs", "state") != "image":
        flat = {k: v for k, v in flat.items() if not k.startswith("image.")}
    if "correction.sample_fusion" in flat and flat.get("mode") in MODE_SPECS:
        fused = resolve_fusion(flat["correction.sample_fusion"], MODE_SPECS[flat["mode"]])
        flat["correction.sample_fusion"] = "inverse_variance" if fused else "mean"
    return flat


# Saved embodied runs and stage fingerprints. `added`: fields added after runs or stages
# were saved, with the value they were made with (the shared sections' fields this
# experiment refuses, at their off values; the debiasing map's bins as the core's defaults
# it used before they were fields). `renamed`: the fields named otherwise in saved configs
# (`wmrl.experiment.renamed`; none of them was ever embodied's, but one list refuses the old
# names in every experiment).
HISTORY = ConfigHistory(
    renamed=renamed.FIELDS,
    added={
        "wm.contact_gate": 0.0, "rl.wm_trust_spread": 0.0, "wm.branch_chunks": 0,
        "wm.dynamics": "mlp", "correction.sample_fusion": "auto", "obs": "state",
        "routing": "uniform", "rl.anchor_lag": 0, "rl.static_check": "off",
        "correction.adaptive_rho": False, "correction.rho_min": 0.125,
        "correction.rho_max": 1.0, "correction.corr_low": 0.0, "correction.corr_high": 0.5,
        "correction.rho_half_life": 16.0, "correction.rho_warmup_groups": 8,
        "correction.uncertainty_share": 0.0, "correction.bin_spacing": "equal_width",
        "correction.min_slope": 0.05, "correction.cheap_limit_s": 0.0,
        "correction.cheap_quantile": 0.0,
    },
    resolve=_resolved,
)  # fmt: skip


def defaults():
    """The ConfigDict every embodied config file starts from (every field's default)."""
    return xconfig.defaults(EmbodiedConfig)


def parse_config(config) -> EmbodiedConfig:
    """`config` (a ConfigDict or dict, unchanged) as the typed embodied config."""
    if isinstance(config, EmbodiedConfig):
        return config
    return xconfig.parse(EmbodiedConfig, config, renamed=HISTORY.renamed)


def validate_embodied_config(config) -> EmbodiedConfig:
    """Bad input -> ConfigError naming the field; the typed config otherwise."""
    cfg = parse_config(config)
    from wmrl.embodied.stages import tasks_of

    tasks_of(cfg)  # the instructions parse, and train and held-out do not overlap
    return cfg
