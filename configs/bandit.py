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

from wmrl.bandits.config import defaults


def get_config() -> ml_collections.ConfigDict:
    """Every field and its default is declared once, in `wmrl.bandits.config` (the problem
    and the suite's sizes are this suite's; the correction's defaults are the core's)."""
    c = defaults()
    c.debias.capacity = 2000  # anchor pairs the monotone map keeps
    # The map's range: a bandit's real rewards are Gaussian around its arms' means (noise 0.3),
    # not bounded to [0, 1] as AutoResearch's and embodied's are.
    c.debias.reward_range = (-0.5, 1.5)
    return c
