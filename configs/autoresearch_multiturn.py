"""Multi-turn Mini AutoResearch: the agent revises its script from feedback (docs/method.md 4).

    python -m wmrl.main --config=configs/autoresearch_multiturn.py --workdir=runs/ar_multiturn

An episode has `env.turns` = K turns; each turn the agent writes a complete script, executed
once; after every turn but the last it reads an observation (status, error type, runtime,
validation metric on a split carved from the public train.csv; never a test label). The
trajectory reward is the best turn's ladder reward on the hidden test labels; in WM-scored
episodes the world model writes every observation. Everything else is the tiny config's
(configs/autoresearch_tiny.py), with a prompt budget that holds the history
(the card, the last script and its observation, the older turns' observations) and a run
sized for a 2-core CPU (24.6 min end to end on the idle 2-core machine with 4 SFT episodes
per task, 16 since 2026-12-08 not yet timed; docs/results.md: the cost of each stage).

Modes as in the tiny config: `--config.mode=real|wm_only|debias_only|denoise_only|wmrl` and the
controls `static_anchors|permuted_wm`.
Anchors are synchronous for K > 1 (an anchor episode's next turn needs its real observation):
`rl.anchor_lag` is 0, and 1 is refused with K > 1.
"""

from pathlib import Path

from wmrl.experiment.config import load_config_file


def _tiny_config():
    return load_config_file(Path(__file__).with_name("autoresearch_tiny.py"))


def get_config():
    c = _tiny_config()
    c.env.turns = 3
    c.rl.anchor_lag = 0  # synchronous anchors: a turn needs the real observation of the last
    # The card (<= 96 tokens), the last script (<= max_new_tokens), the last observation and
    # up to K - 2 older observations (`wmrl.autoresearch.history`).
    c.data.max_prompt_len = 448
    # The WM writes every observation field: the error-type head on (P(class | runtime
    # error)); the validation metric from the leaderboard map of its expected reward.
    c.wm.error_type_coef = 0.5
    # 16 executed SFT episodes per training task (4 before 2026-12-08): with 4, the warm
    # start's revisions spliced pieces of the earlier script into lines of their own (turn-2
    # MALFORMED 41 of 96 against 9 at turn 1); with 16, 13 of 96 (docs/results.md, 2026-12-08).
    # About 3x the episodes' executions (~26 x 16 x 3 turns, the kept ones not executed).
    c.env.sft_episodes_per_task = 16
    # 240 SFT steps of 16 (the tiny config's 300 cost ~0.9 min more here: docs/results.md).
    c.policy.sft_steps = 240
    # The held-out tasks' corpus scripts only measure the pretrained WM (nothing trains on
    # them): 4 of the 12 per task, the first 4 of the same sequence (a shared single-turn
    # corpus holds them), a third of the data stage's held-out executions.
    c.data.heldout_scripts_per_task = 4
    c.rl.steps = 12
    # The policy step's K x N = 96 rows of 704 tokens in 4 micro-batches of 24 (the same
    # gradient, accumulated): in one batch its activations are several GB and the step is
    # dominated by the kernel's page faults on a small machine (timings: docs/results.md).
    c.rl.num_micro_batches = 4
    # Sized for the 25-minute budget of a 2-core CPU (the end-to-end time: docs/results.md):
    # every held-out turn is executed, so one evaluation of the 32 held-out tasks x
    # eval_samples episodes is 32 * eval_samples * K executions. 2 episodes per task, at the
    # warm start and the final step: 2 x 192 = 384 executions per evaluation (4 per task at
    # four evaluations would be 4x the executions); the standard error of one evaluation
    # grows by up to sqrt(2). The speedup benchmark sets its own evaluation times
    # (`rl.eval_at_s`).
    c.rl.eval_every = 12
    c.rl.checkpoint_every = 6
    c.rl.eval_samples = 2  # episodes per held-out task (each K executions)
    return c
