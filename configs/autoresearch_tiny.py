"""World Model RL on Mini AutoResearch, tiny enough for a 2-core CPU (the README's main job).

    python -m wmrl.main --config=configs/autoresearch_tiny.py --workdir=runs/ar_tiny

Modes from the same code: `--config.mode=real|wm_only|debias_only|denoise_only|wmrl`;
uncertainty-aware anchor routing with `--config.routing=uncertainty`. Rerunning the same
command on the same workdir resumes from the latest complete checkpoint.

Stages (each resumable, outputs under `<data_dir>` and `<workdir>`): build the task subset and
execute the authored corpus (`data_dir`, shared between runs), train the tokenizer, warm-start
the policy by SFT on the corpus scripts, pretrain the world model on the executed
trajectories (train tasks only), then RL with held-out evaluation every `rl.eval_every` steps.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.experiment = "autoresearch"
    c.seed = 0
    c.mode = "wmrl"  # real | wm_only | debias_only | denoise_only | wmrl
    c.routing = "uniform"  # uniform | uncertainty (the extension)
    c.target_reward = 0.65  # held-out reward that defines time_to_target_s (warm start ~0.575)
    # Shared, resumable data stage (suite subset, executed corpus, tokenizer). '' = <workdir>/data.
    c.data_dir = ""
    # Warm-start and pretrained-WM checkpoints to start from ('' = train them in <workdir>).
    # The speedup benchmark points every mode at the same ones.
    c.init_dir = ""

    c.suite = ml_collections.ConfigDict()
    c.suite.dir = ""  # an existing suite (task dirs + suite.json); '' = build `tasks` below
    # Every built-in training task (more prompts make a warm start that generalises) and 32
    # held-out tasks that share the column naming of most training tasks (`target`, `id`), so
    # what has to transfer is the craft (impute, encode, write the submission, no syntax
    # slips) rather than copying unseen column names, which a policy this small cannot learn
    # in minutes: three hand-made ones and 29 members of the generated family of the same
    # kinds (`heldout-family-NN`, `wmrl.autoresearch.env.suite.heldout_family`). Many tasks
    # with few scripts each (`rl.eval_samples`) make one evaluation's standard error, which
    # counts the variance between tasks, smaller for the same executions (docs/results.md).
    c.suite.tasks = (
        "iris-species", "wine-cultivar", "breast-cancer-auc", "digits-8x8",
        "diabetes-progression", "penguins-species", "penguins-body-mass", "cars-mpg",
        "seattle-weather-type", "synth-easy", "synth-imbalanced-f1", "synth-imbalanced-auc",
        "synth-high-dim", "synth-regression-noisy", "friedman1", "friedman2", "hastie-10-2",
        "large-n-tight", "large-n-regression", "synth-missing", "synth-categorical",
        "breast-cancer-missing", "wine-noisy-labels", "diabetes-mae", "moons", "circles-auc",
        "heldout-categorical-missing", "heldout-gaussian-quantiles", "heldout-imbalanced-missing",
        *(f"heldout-family-{j:02d}" for j in range(1, 30)),
    )  # fmt: skip
    c.suite.workers = 2  # sandbox slots (same for every mode); per node with executor=ray
    # Where sandboxes run (docs/ray.md): "local" (this host) | "ray" (one pool per Ray node).
    c.suite.executor = "local"
    c.suite.ray_address = "auto"  # "auto" | "local" (start one here) | "ray://host:port"
    c.suite.allow_mixed_isolation = False  # executor=ray: accept nodes at the rlimits level
    c.suite.time_limit_s = 20.0  # caps each task's own time limit (s)

    # The episode (docs/method.md 4): env.turns = K scripts per episode, each executed once,
    # the agent reading an observation of each turn but the last; the trajectory reward is the
    # best turn's. K = 1 is the single-turn setting exactly (configs/autoresearch_multiturn.py).
    c.env = ml_collections.ConfigDict()
    c.env.turns = 1
    # K > 1: executed multi-turn episodes per training task for the warm start (a script with
    # a controlled mistake, its real observation, the fix; or a good script kept or improved).
    c.env.sft_episodes_per_task = 4

    c.data = ml_collections.ConfigDict()
    c.data.scripts_per_task = 12  # authored scripts executed per task (WM data, SFT)
    c.data.sft_scripts_per_task = 40  # more authored scripts for SFT only (not executed)
    # Executed per held-out task, only to measure the pretrained WM on unseen tasks (nothing
    # trains on them); -1: as many as data.scripts_per_task.
    c.data.heldout_scripts_per_task = -1
    c.data.mistake_rate = 0.35
    c.data.vocab_size = 4000
    c.data.max_prompt_len = 96
    c.data.max_new_tokens = 256

    # Start policy and WM trunk from a Hugging Face checkpoint (Qwen3 or Llama dense,
    # safetensors): a local directory; '' = the tiny random transformer of `policy` below and a
    # SentencePiece tokenizer trained on the corpus. See configs/qwen3_4b.py.
    c.pretrained = ml_collections.ConfigDict()
    c.pretrained.checkpoint = ""
    c.pretrained.dtype = "float32"  # compute dtype
    c.pretrained.param_dtype = "float32"  # master weights (and Adam moments)
    c.pretrained.remat = False
    c.pretrained.wm_trunk = True  # WM trunk = the checkpoint too (else wm.* below, random)
    c.pretrained.prompt_template = "{prompt}"  # e.g. a chat template for instruct models

    c.policy = ml_collections.ConfigDict()
    c.policy.size = "tiny"
    c.policy.d_model = 128
    c.policy.num_layers = 2
    c.policy.mlp_dim = 384
    c.policy.head_dim = 32
    c.policy.sft_steps = 300
    c.policy.sft_batch_size = 16
    c.policy.sft_learning_rate = 3e-3

    c.wm = ml_collections.ConfigDict()
    # What scores the WM stream: "neural" (the transformer WM below) or "features" (a ridge
    # regression on script and card features any user could list, refitted on the anchors:
    # wmrl/autoresearch/feature_wm.py, the baseline the neural WM must beat; single-turn).
    c.wm.kind = "neural"
    c.wm.d_model = 64
    c.wm.num_layers = 2
    c.wm.mlp_dim = 192
    c.wm.head_dim = 16
    c.wm.num_members = 4
    c.wm.pretrain_steps = 200  # the most pretraining steps (fewer with early stopping)
    # Early stopping (wmrl.autoresearch.stages.pretrain_wm): every e > 0 steps the WM's
    # within-task ranking of held-out rows (the held-out policy samples when the WM fits on
    # policy samples, else the corpus validation split) is measured; the best parameters are
    # kept and training stops after `pretrain_patience` measurements without a new best.
    # 0 = train exactly `pretrain_steps`.
    c.wm.pretrain_eval_every = 0
    c.wm.pretrain_patience = 5
    c.wm.seed = -1  # the WM's init and pretraining-batch seed; -1 = `seed` + 1
    c.wm.batch_size = 16
    c.wm.learning_rate = 1e-3
    c.wm.rank_coef = 0.0  # within-task pairwise ranking loss beside the NLL (0 = NLL only)
    # Runtime head (censored log-runtime NLL, this weight; 0 = no head): the WM score becomes
    # (1 - P(timeout)) * reward head + P(timeout) * TIMEOUT's reward, P(timeout) under the
    # script's time limit (the task's, capped by suite.time_limit_s). docs/results.md.
    c.wm.runtime_coef = 0.5
    # Multi-turn feedback heads (wmrl/autoresearch/wm_observation.py; 0 = no head): the
    # exception class of a RUNTIME_ERROR (observation.ERROR_TYPES) and the raw validation
    # metric (episode executions only). The single-turn job reads no feedback: off.
    c.wm.error_type_coef = 0.0
    c.wm.validation_coef = 0.0
    c.wm.trunk_from_policy = False  # WM trunk = the warm-started policy's (its width, weights)
    c.wm.validation_every = 0  # k > 0: every k-th script of a train task is held out (report)
    c.wm.group_rows = 1  # pretraining batches of tasks x this many of their scripts (1 = rows)
    # k > 0: after the warm start, k scripts per training task sampled from the policy as RL
    # samples and executed as RL executes (a cached stage, <init_dir>/policy_samples), added
    # to the WM pretraining rows: the WM then sees the scripts it scores in RL. 0 = corpus only.
    c.wm.policy_samples_per_task = 0
    # Every v-th policy sample of each task is held out of pretraining (the report's
    # policy_validation: within-task Spearman on new policy scripts); 0 = none held out.
    c.wm.policy_validation_every = 4
    c.wm.online_learning_rate = 3e-4
    c.wm.online_steps = 2  # WM fine-tuning steps per RL step, on the replay of real outcomes
    c.wm.replay_size = 512

    c.rl = ml_collections.ConfigDict()
    # Sized so that `make run` (all stages + RL + evaluations) fits a 2-core CPU in about 20
    # minutes; held-out reward plateaus well before the last step (docs/results.md).
    c.rl.steps = 20
    # The RL run's seed (policy sampling, task order, routing, executions); -1 = `seed`. The
    # stages before RL use `seed`: runs differing only here share them (speedup --seeds).
    c.rl.seed = -1
    c.rl.max_wall_time_s = 0.0  # stop RL once training wall-clock reaches this (0 = no limit)
    c.rl.tasks_per_step = 8  # B groups
    c.rl.group_size = 4  # G samples per task
    c.rl.batch_size = 0  # trajectories per step; 0 = tasks_per_step * group_size
    c.rl.num_micro_batches = 1  # policy update in this many gradient-accumulation chunks
    # Anchor groups of step t execute while step t+1 generates and trains; step t+1 trains on
    # them (one update old: the PPO ratio against their sampling log-probs corrects for it).
    # 0 = wait for them in their own step. Modes with a WM stream only; `real` is synchronous.
    c.rl.anchor_lag = 1
    # Outcomes the WM stream takes from a static check (no execution) instead of the WM:
    # "compile": a script that does not compile gets MALFORMED's exact reward 0 (the sandbox
    # pool's own pre-execution check); "names": also RUNTIME_ERROR's 0.1 for a script that
    # reads a name it never defines (a forgotten import: most of a tiny policy's runtime
    # errors, which a tiny WM cannot see); "off". Modes with a WM only.
    c.rl.static_check = "names"
    c.rl.learning_rate = 2e-4
    c.rl.clip_eps = 0.2
    c.rl.kl_coef = 0.05
    c.rl.entropy_coef = 0.0  # entropy bonus in the policy loss (0 = off)
    c.rl.temperature = 0.7  # sampling (train and eval); log-probs are the untempered policy's
    # Dr.GRPO (no division by the group's std): a group whose WM scores barely differ gives
    # small advantages instead of unit-variance noise. With std division, calibrated WM scores
    # of a weak WM (nearly constant within a group) were blown up to +-1 and the policy
    # drifted into malformed scripts within 20 steps.
    c.rl.normalize_std = False
    c.rl.std_eps = 1e-4  # added to a group's std when normalize_std (the paper's reference)
    c.rl.baseline = "mean"  # or "rloo"
    c.rl.eval_every = 5
    # Also evaluate whenever training wall-clock passes a multiple of this (0 = off), and at
    # the first step boundary at or after each of the training wall-clock points (s) below:
    # modes with different step times are then evaluated at the same wall-clock points. The
    # speedup benchmark uses a geometric grid of points: a time ratio then has the same
    # resolution whether the target is reached at 20 s or at 200 s.
    c.rl.eval_every_s = 0.0
    c.rl.eval_at_s = ()
    # k scripts per held-out task: 32 tasks x 3 = 96 executions per evaluation (was 3 x 8).
    c.rl.eval_samples = 3
    c.rl.checkpoint_every = 5
    c.rl.keep_checkpoints = 3

    c.correction = ml_collections.ConfigDict()
    # Anchor fraction: 2 of the 8 groups (the method's default 0.10 would round to 1). With
    # `rl.anchor_lag` the anchors execute while the next step computes, and one group left
    # the 2 sandbox workers idle part of each step; two double the real signal for a longer
    # step (the speedup benchmark measures both; docs/results.md).
    c.correction.rho = 0.25
    # Fidelity-driven anchor fraction (ours, docs/method.md 3.10; off = the fixed `rho` above): the
    # anchor fraction moves between rho_min (the WM stream ranks the anchors' scripts as
    # their real rewards do) and rho_max (it has collapsed: every group executed, standard
    # GRPO), from the anchors' measured within-group agreement; `rho` holds until the rule has
    # measured 8 groups. Modes with a WM stream, not the control static_anchors.
    c.correction.adaptive_rho = False
    c.correction.rho_min = 0.125  # 1 of the 8 groups
    c.correction.rho_max = 1.0
    c.correction.min_groups = 1
    c.correction.uncertainty_share = 0.5  # used when routing = uncertainty
    c.correction.min_pairs = 24  # monotone map: identity until this many anchor pairs
    c.correction.refit_every = 8
    c.correction.num_bins = 10
    # Equal-width bins (the paper's) or equal-mass (quantiles of the window's WM scores); the
    # map is blended with the identity (weight min_slope) so it is strictly increasing.
    c.correction.bin_spacing = "equal_width"
    c.correction.min_slope = 0.05
    c.correction.capacity = 5000
    c.correction.denoise_warmup_groups = 4
    c.correction.denoise_half_life = 16.0
    c.correction.denoise_target = 2.0
    c.correction.denoise_w_max = 4.0
    # How the WM ensemble's members become one score: auto = the mode's (inverse-variance
    # fusion in denoise_only and wmrl, the members' mean in the others), or force
    # inverse_variance | mean.
    c.correction.sample_fusion = "auto"
    return c
