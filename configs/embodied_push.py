"""Embodied transfer: WMRL post-trains a language-conditioned pushing policy (MuJoCo, CPU).

    python -m wmrl.main --config=configs/embodied_push.py --workdir=runs/embodied

A seconds-long smoke setting: `--config=configs/embodied_push.py:tiny`.

Modes from the same code: `--config.mode=real|wm_only|debias_only|denoise_only|wmrl|static_anchors`
(`static_anchors` is the control: the same anchors, but every WM-scored episode gets one shared
score, the recent mean real success of the anchors: the core's constant-score control, an EMA
with a half-life of 64 anchor episodes). The correction is the shared one,
`wmrl.core.correct.correct_rewards`. Rerunning the same command on the same
workdir resumes (finished stages are loaded, RL continues from its latest checkpoint).

Stages (under `<workdir>/init`, or `init_dir` to share them between runs): expert demos ->
behaviour cloning -> world-model pretraining (demos + real rollouts of the BC policy) -> RL
with held-out evaluation by real rollouts. Observations: `obs = "state"` (the default) or
`"image"` (top-down images drawn from the state; docs/embodied.md says which variant each
result used).

Cost is counted in real episodes (what a robot pays); `env.real_episode_cost_s` declares a
per-episode latency for the modelled robot time in summary.json (nothing sleeps).
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """`configs/embodied_push.py` (the default) or `configs/embodied_push.py:tiny`."""
    if arg not in (None, "", "tiny"):
        raise ValueError(f"unknown config variant {arg!r}; use configs/embodied_push.py[:tiny]")
    c = ml_collections.ConfigDict()
    c.experiment = "embodied"
    c.seed = 0
    c.mode = "wmrl"  # real | wm_only | debias_only | denoise_only | wmrl | static_anchors
    # state: the policy reads the objects' xy. image (VLA-style): it sees the blocks only in
    # two top-down RGB images drawn from the state (first frame, current frame; `image`
    # below) plus the pusher's own xy. The world model imagines states either way.
    c.obs = "state"
    c.init_dir = ""  # shared stages ('' = <workdir>/init)
    # Held-out success that defines real_episodes_to_target (warm start 0.363; `real` reached it
    # in 384, 256 and 640 real episodes on three seeds, docs/results.md 2026-12-02).
    c.target_success = 0.45

    c.image = ml_collections.ConfigDict()  # read only with obs = "image"
    c.image.pixels = 32  # side of each image (1.9 cm per pixel over the 60 cm square)
    c.image.patch = 4  # side of a patch token: 64 patch tokens (a stride-4 convolution)
    c.image.extent = 0.3  # half-width of the drawn square (m), centred on the table
    # FiLM: the instruction scales and shifts the patch embeddings (RT-1's conditioning)
    c.image.film = True
    # BC sees each demo step translated by up to this (m): DrQ's random shifts, in the world
    c.image.bc_shift = 0.05

    c.env = ml_collections.ConfigDict()
    c.env.colours = ("red", "green", "blue")  # the scene's blocks
    c.env.episode_len = 40  # actions per episode (0.1 s each)
    c.env.action_bins = 5  # per axis: 25 action tokens
    c.env.max_speed = 0.2
    c.env.action_dt = 0.1
    c.env.timestep = 0.005
    c.env.push_distance = 0.10
    c.env.success_radius = 0.03
    c.env.workspace = 0.15
    c.env.min_separation = 0.08
    c.env.real_episode_cost_s = 0.0  # declared robot latency per real episode (modelled only)

    c.tasks = ml_collections.ConfigDict()
    # Unseen instruction combinations: every colour and every direction is trained, not these.
    c.tasks.heldout = (
        "push the red block back",
        "push the green block left",
        "push the blue block forward",
    )
    c.tasks.train = ()  # () = the other 9 instructions

    c.demos = ml_collections.ConfigDict()
    c.demos.episodes = 240
    c.demos.successful_only = True

    c.policy = ml_collections.ConfigDict()
    c.policy.chunk = 4  # actions per policy call
    c.policy.d_model = 64
    c.policy.num_layers = 2
    c.policy.num_heads = 4
    c.policy.mlp_dim = 128
    # Read the scene in the instruction's frame (a built-in rotation symmetry; docs/embodied.md)
    c.policy.canonical_frame = True
    c.policy.bc_steps = 1500
    c.policy.bc_batch_size = 128
    c.policy.bc_learning_rate = 2e-3

    c.wm = ml_collections.ConfigDict()
    c.wm.num_members = 4
    # Learned dynamics: object (a learned pusher map and one block MLP gated by the pusher's
    # swept path, trained under the square's symmetries) | mlp (one MLP of the whole state, whose
    # imagined blocks drift). The runs before 2026-12-02 used mlp with head_inputs="path",
    # unroll=1, batch_transitions=256, online_steps=4, correction.rho=0.25, rl.eval_every=5;
    # docs/embodied.md.
    c.wm.dynamics = "object"
    c.wm.hidden = 128
    c.wm.head_hidden = 64
    # What the success head reads: the imagined final state (final), + the imagined pusher
    # path (final+path), or the instruction and the path only (path; the best with the `mlp`
    # dynamics, whose imagined blocks drift); docs/embodied.md.
    c.wm.head_inputs = "final"
    # Contact gate of the `mlp` dynamics (m, 0 = off): an imagined block moves only while the
    # pusher or another block is this close (docs/results.md 2026-12-01 imagination vs
    # simulator). The `object` dynamics gate by the pusher's swept path instead.
    c.wm.contact_gate = 0.0
    # Branched imagination (chunks, 0 = off): a WM group is G imagined branches of this many
    # chunks from one real state of the step's anchor episodes, scored by a success-to-go head
    # (MBPO's short model rollouts; docs/embodied.md). 0: whole episodes from a fresh start.
    c.wm.branch_chunks = 0
    c.wm.policy_rollouts = 192  # real BC-policy episodes for WM pretraining (counted)
    c.wm.pretrain_steps = 800
    c.wm.batch_transitions = 512  # training windows per member and step
    # Actions per training window: the dynamics loss is a K-step open-loop unroll. With the
    # object dynamics K=4 keeps the pusher 1 mm off over an episode where K=1 drifts 6 mm (the
    # servo's lag telescopes over a window, not over one step); docs/results.md 2026-12-02.
    c.wm.unroll = 4
    c.wm.batch_episodes = 64
    c.wm.learning_rate = 1e-3
    c.wm.online_learning_rate = 3e-4
    # Per RL step, on the replay of real episodes. 16 keeps the WM up with the policy: at 4 the
    # policy drifted into what the WM imagined wrong and `wmrl` fell back to 0.40 by step 40
    # on one seed (3 seeds: final 0.436 at 4, 0.473 at 16; docs/results.md 2026-12-02).
    c.wm.online_steps = 16
    # Real episodes the WM trains on online (first in, first out; the demos and BC rollouts
    # come first). 256 (the latest only, after 32 steps just the anchors) removed the WM's level
    # bias but not its within-group order: final 0.471 vs 0.468 over 10 seeds, below `real` on
    # fresh ones (docs/results.md 2026-12-03).
    c.wm.replay_size = 2048

    c.rl = ml_collections.ConfigDict()
    c.rl.steps = 40
    c.rl.seed = 0  # policy sampling, task order and routing (the stages use `seed`)
    c.rl.groups_per_step = 8  # B start states (instruction + layout)
    c.rl.group_size = 8  # G rollouts per start
    c.rl.learning_rate = 1e-4
    c.rl.ppo_epochs = 2
    c.rl.clip_eps = 0.2
    c.rl.kl_coef = 0.02
    c.rl.temperature = 1.0
    # Imagined episodes: train only the tokens emitted before the WM members first disagree by
    # this much (m, largest block std across members) on the state the policy read; 0 = all.
    c.rl.wm_trust_spread = 0.0
    c.rl.normalize_std = True
    # Every 2 steps: `real` spends 64 real episodes a step, so its episodes to the target are
    # known to 128 (at 5: to 320, which flattered any mode with fewer episodes per step).
    c.rl.eval_every = 2
    c.rl.eval_episodes = 300  # held-out real episodes per evaluation (SE <= 0.03)
    c.rl.eval_greedy = False
    c.rl.checkpoint_every = 5

    c.correction = ml_collections.ConfigDict()
    # Anchor groups per step: 1 of 8 (the paper's default fraction is 0.10). At 0.25 (2 of 8,
    # 3 seeds): target at 149 real episodes on average, final 0.473; at 0.125: 117, final 0.462
    # (docs/results.md 2026-12-02).
    c.correction.rho = 0.125
    c.correction.min_groups = 1
    c.correction.debias = "monotone"  # the paper's map (keys = task would cancel in a group)
    c.correction.min_pairs = 64
    c.correction.refit_every = 16
    c.correction.num_bins = 10
    c.correction.capacity = 5000
    c.correction.denoise_warmup_groups = 8
    c.correction.denoise_half_life = 16.0
    c.correction.denoise_target = 2.0
    c.correction.denoise_w_max = 4.0
    # How the WM members' scores of one episode become its score (docs/method.md 3.5, sample
    # level): `inverse_variance` (`wmrl.core.denoise.fuse_ensemble`), `mean`, or `auto` (the
    # mode's row: inverse variance in denoise_only / wmrl, the mean in the other modes).
    c.correction.sample_fusion = "auto"
    return tiny(c) if arg == "tiny" else c


def tiny(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """A seconds-long setting for smoke tests and the notebook's headless run."""
    c.demos.episodes = 24
    c.policy.bc_steps = 20
    c.policy.d_model = 32
    c.policy.num_layers = 1
    c.policy.mlp_dim = 64
    c.wm.policy_rollouts = 16
    c.wm.pretrain_steps = 20
    c.wm.hidden = 32
    c.wm.head_hidden = 16
    c.wm.online_steps = 1
    c.wm.batch_transitions = 64
    c.rl.steps = 2
    c.rl.groups_per_step = 4
    c.rl.group_size = 4
    c.rl.eval_every = 1
    c.rl.eval_episodes = 8
    c.rl.ppo_epochs = 1
    c.rl.checkpoint_every = 1
    c.correction.rho = 0.5
    return c
