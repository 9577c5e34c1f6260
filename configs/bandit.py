"""Synthetic-bandit reproduction of the WMRL theory: every variant, many seeds, one command.

    python -m wmrl.main --config=configs/bandit.py --workdir=runs/bandit

Override any field, e.g. the contextual variant with fewer seeds:

    python -m wmrl.main --config=configs/bandit.py --workdir=runs/bandit_ctx \\
        --config.bandit.contextual=True --config.num_seeds=32

The default is a 5-armed bandit whose WM bias flips the argmax (arm 1 looks better than arm 0
to the WM) and whose best arm is also the WM's noisiest, so the negative control
`cross_arm_iv` fails on it.
"""

import ml_collections

from wmrl.bandits.problem import VARIANTS


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "bandit"
    c.seed = 0  # seeds of the runs: seed, seed+1, ...
    c.problem_seed = 1234  # the (fixed) problem: context weights, evaluation contexts
    c.num_seeds = 64
    c.num_steps = 3000
    c.learning_rate = 0.05
    c.threshold = 0.05  # suboptimality target
    c.log_points = 200
    c.eval_contexts = 256
    c.variants = VARIANTS  # real, wm_only, debias_only, denoise_only, wmrl, + ablations

    c.bandit = ml_collections.ConfigDict()
    c.bandit.true_rewards = (1.0, 0.9, 0.7, 0.5, 0.2)
    c.bandit.wm_bias = (0.0, 0.25, 0.0, 0.05, -0.1)
    c.bandit.wm_noise = (0.8, 0.2, 0.3, 0.3, 0.3)
    c.bandit.head_scales = (0.5, 1.0, 2.0, 4.0)
    c.bandit.real_noise = 0.3
    c.bandit.rho = 0.1  # target anchor fraction: share of groups executed for real
    c.bandit.anchor_fraction = None  # deprecated name of rho (when set, it is used and said)
    c.bandit.real_cost = 10.0
    c.bandit.batch_size = 64
    c.bandit.group_size = 8
    c.bandit.baseline = "mean"  # or "rloo"
    c.bandit.normalize_std = True
    # How WM scores are drawn: "exact" samples the fused (or averaged) score from its exact
    # Gaussian law, one draw per pull; "heads" draws all M heads and combines them. Equal in
    # law; "exact" is ~2x faster on CPU.
    c.bandit.wm_sampling = "exact"
    c.bandit.constant_bias = 0.3  # the global offset of the `constant_bias` control
    c.bandit.contextual = False
    c.bandit.context_dim = 4
    c.bandit.context_scale = 0.1  # how much the context moves the true rewards
    c.bandit.context_bias_scale = 0.03  # how much it moves the WM bias (arm keys miss it)

    # Online Debiasing: bandits key offsets by arm (the monotone map is the ablation).
    c.debias = ml_collections.ConfigDict()
    c.debias.offset_rule = "window"
    c.debias.window = 256
    c.debias.half_life = 64.0
    c.debias.min_count = 8
    c.debias.capacity = 2000
    c.debias.num_bins = 10
    c.debias.bin_spacing = "equal_width"  # or "equal_mass" (quantiles of the window's scores)
    c.debias.min_slope = 0.05  # the map's blend with the identity: strictly increasing
    c.debias.min_pairs = 200
    c.debias.refit_every = 64
    c.debias.reward_range = (-0.5, 1.5)

    c.denoise = ml_collections.ConfigDict()
    c.denoise.half_life = 64.0
    c.denoise.warmup_groups = 32
    c.denoise.target = 2.0
    c.denoise.w_max = 4.0
    return c
