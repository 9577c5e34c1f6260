"""Named config settings shared by code and tests (dotted fields -> values)."""

# The smallest AutoResearch setting that runs every stage in seconds: 1 train + 1 held-out
# task, a few executed scripts, tiny models, 2 RL steps. The trainer tests build on it
# (tests/support/rl_fixtures.py) and so does the GPU suite's CPU dry run
# (wmrl.tools.prepare_gpu_artefacts), which then reuses the stages a test session built.
TINY_SETTING = {
    "suite.tasks": ("iris-species", "heldout-gaussian-quantiles"),
    "suite.workers": 2,
    "data.scripts_per_task": 6,
    "data.sft_scripts_per_task": 10,
    "data.vocab_size": 1500,
    "data.max_prompt_len": 112,
    "data.max_new_tokens": 256,
    "policy.d_model": 32,
    "policy.num_layers": 1,
    "policy.mlp_dim": 64,
    "policy.head_dim": 8,
    "policy.sft_steps": 3,
    "policy.sft_batch_size": 4,
    "wm.d_model": 32,
    "wm.num_layers": 1,
    "wm.mlp_dim": 64,
    "wm.head_dim": 8,
    "wm.num_members": 2,
    "wm.pretrain_steps": 2,
    "wm.pretrain_eval_every": 0,  # a fixed step count (the tests set their own)
    "wm.policy_samples_per_task": 0,
    "wm.batch_size": 4,
    "wm.online_steps": 1,
    "wm.replay_size": 16,
    "rl.steps": 2,
    "rl.groups_per_step": 2,
    "rl.group_size": 2,
    "rl.eval_every": 2,
    "rl.eval_samples": 2,
    "rl.checkpoint_every": 1,
    "correction.min_pairs": 2,
    "correction.refit_every": 1,
    "correction.denoise_warmup_groups": 1,
}

# On top of TINY_SETTING: two-turn episodes (tests/autoresearch/test_multiturn.py), a prompt
# budget that holds one turn's history (`wmrl.autoresearch.history.min_prompt_len`), two
# executed SFT episodes.
TINY_MULTITURN_SETTING = {
    "env.turns": 2,
    "rl.anchor_lag": 0,
    "data.max_prompt_len": 400,
    "env.sft_episodes_per_task": 2,
}
