"""World Model RL on Mini AutoResearch, tiny enough for a 2-core CPU (the README's main job).

    python -m wmrl.main --config=configs/autoresearch_tiny.py --workdir=runs/ar_tiny

Modes from the same code: `--config.mode=real|wm_only|debias_only|denoise_only|wmrl` and the
controls `static_anchors|permuted_wm` (docs/method.md 7);
uncertainty-aware anchor routing with `--config.routing=uncertainty`. Rerunning the same
command on the same workdir resumes from the latest complete checkpoint.

Stages (each resumable, outputs under `<data_dir>` and `<workdir>`): build the task subset and
execute the authored corpus (`data_dir`, shared between runs), train the tokenizer, warm-start
the policy by SFT on the corpus scripts, pretrain the world model on the executed
trajectories (train tasks only), then RL with held-out evaluation every `rl.eval_every` steps.

Every field and its default is declared once, in `wmrl.autoresearch.config` (AutoResearch's
own sections are sized for this job there); this file sets the shared RL and correction
settings the job uses (`wmrl.experiment.sections` holds their defaults: the core's, with
every optional feature off).
"""

import ml_collections

from wmrl.autoresearch.config import defaults


def get_config() -> ml_collections.ConfigDict:
    c = defaults()
    # Anchor groups of step t execute while step t+1 generates and trains; step t+1 trains on
    # them (one update old: the PPO ratio against their sampling log-probs corrects for it).
    c.rl.anchor_lag = 1
    # The WM stream takes a static check's outcome for what it cannot see: a script that does
    # not compile gets MALFORMED's exact reward 0 (the sandbox pool's own pre-execution check),
    # one that reads a name it never defines RUNTIME_ERROR's 0.1 (a forgotten import: most of
    # a tiny policy's runtime errors, which a tiny WM cannot see).
    c.rl.static_check = "names"
    # Sized so that `make run` (all stages + RL + evaluations) fits a 2-core CPU in about 20
    # minutes; held-out reward plateaus well before the last step (docs/results.md).
    c.rl.steps = 20
    # Dr.GRPO (no division by the group's std): a group whose WM scores barely differ gives
    # small advantages instead of unit-variance noise. With std division, calibrated WM scores
    # of a weak WM (nearly constant within a group) were blown up to +-1 and the policy
    # drifted into malformed scripts within 20 steps.
    c.rl.normalize_std = False

    # Anchor fraction: 2 of the 8 groups (the method's default 0.10 would round to 1). With
    # `rl.anchor_lag` the anchors execute while the next step computes, and one group left
    # the 2 sandbox workers idle part of each step; two double the real signal for a longer
    # step (the speedup benchmark measures both; docs/results.md).
    c.correction.rho = 0.25
    c.correction.uncertainty_share = 0.5  # with --config.routing=uncertainty
    c.correction.min_pairs = 24  # monotone map: identity until this many anchor pairs
    c.correction.refit_every = 8
    c.correction.denoise_warmup_groups = 4
    c.correction.denoise_half_life = 16.0
    return c
