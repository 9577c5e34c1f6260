"""GRPO post-training of the chunk policy with WMRL's correction, modes from the same code.

One RL step (DESIGN.md 3, embodied):
  1. B start states (instruction + layout) from the training tasks, G rollouts each (a group).
  2. Route: `wmrl.core.routing.route_anchors` picks whole anchor groups (seeded by seed and
     step). Mode `real` executes every group.
  3. Anchor groups run in MuJoCo (real episodes, sparse success); every other group is
     imagined by the world model with the policy in the loop (`world_model.imagine`) and never
     steps the simulator. Anchors are also replayed through the WM: (WM score, real success)
     pairs of the same trajectories. With `wm.branch_chunks` = k > 0 a WM group is instead G
     imagined k-chunk branches from one real state of this step's anchor episodes
     (`Trainer.branched_groups`), scored by the success-to-go head.
  4. Raw WM score per episode: members fused by inverse variance
     (`wmrl.core.denoise.fuse_ensemble`) or averaged, as `correction.sample_fusion` says
     (`auto`: fused in the denoising modes, denoise_only / wmrl, averaged in the others).
  5. The correction is the shared one, `wmrl.core.correct.correct_rewards` (the AutoResearch
     trainer's; it calls `wmrl.core.correct.correct`, the bandits' too) with the mode's row of
     `wmrl.core.correct.MODE_SPECS`: Online Debiasing, the anchor pairs folded into the
     estimators, real success in the anchor groups, group advantages and the stream-level
     anchor weight. `static_anchors` is the table's constant-score control (its
     spec; this setting has no static check): every WM episode gets the recent mean real
     success of the anchors.
  6. PPO-clip token loss `wmrl.core.grpo.token_policy_loss` over the action tokens with KL to
     the BC policy; the WM is fine-tuned on the replay of real episodes.

No correction maths is written here; it is all imported from `wmrl.core`
(tests/test_embodied_e2e.py spies on `correct` during a run).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl.core import correct, debias, denoise, grpo, routing
from wmrl.core.state import init_correction_state
from wmrl.embodied import policy as pol
from wmrl.embodied import rollout
from wmrl.embodied import world_model as wmodel

# The shared table (`wmrl.core.correct.MODE_SPECS`), every mode with the switches it has in
# every experiment. `static_anchors` is the constant-score control; this setting has no
# static check, so it is the same anchors with one shared score for every WM episode.
MODE_SPECS = correct.MODE_SPECS
# The control's name before the experiments shared one table (saved configs may hold it).
LEGACY_MODE_NAMES = {"constant_wm": "static_anchors"}


@dataclasses.dataclass(frozen=True)
class RLStatics:
    mode: str
    groups: int
    group_size: int
    chunk: int
    episode_len: int
    temperature: float
    clip_eps: float
    kl_coef: float
    normalize_std: bool
    ppo_epochs: int
    push_distance: float
    contact_gate: float
    wm_trust_spread: float
    branch_chunks: int
    sample_fusion: str
    routing: routing.RoutingConfig
    debias: debias.DebiasConfig
    denoise: denoise.DenoiseConfig

    @property
    def spec(self) -> correct.ModeSpec:
        return MODE_SPECS[self.mode]

    @property
    def uses_wm(self):
        return self.spec.uses_wm

    @property
    def fused(self) -> bool:
        """Whether the WM members are fused by inverse variance (else averaged)."""
        return correct.resolve_fusion(self.sample_fusion, self.spec)

    @property
    def anchor_group_count(self) -> int:
        if not self.uses_wm:
            return self.groups
        return int(routing.num_anchor_groups(self.groups, self.groups, self.routing))


def statics_from_config(config) -> RLStatics:
    cc = config.correction
    return RLStatics(
        mode=config.mode,
        groups=config.rl.groups_per_step,
        group_size=config.rl.group_size,
        chunk=config.policy.chunk,
        episode_len=config.env.episode_len,
        temperature=config.rl.temperature,
        clip_eps=config.rl.clip_eps,
        kl_coef=config.rl.kl_coef,
        normalize_std=config.rl.normalize_std,
        ppo_epochs=config.rl.ppo_epochs,
        push_distance=config.env.push_distance,
        contact_gate=config.wm.contact_gate,
        wm_trust_spread=config.rl.wm_trust_spread,
        branch_chunks=config.wm.branch_chunks,
        sample_fusion=config.correction.sample_fusion,
        routing=routing.RoutingConfig(rho=cc.rho, min_groups=cc.min_groups),
        debias=debias.DebiasConfig(
            mode=cc.debias if MODE_SPECS[config.mode].debias else "none",
            num_keys=12,
            capacity=cc.capacity,
            num_bins=cc.num_bins,
            min_pairs=cc.min_pairs,
            refit_every=cc.refit_every,
            reward_range=(0.0, 1.0),
        ),
        denoise=denoise.DenoiseConfig(
            half_life=cc.denoise_half_life,
            warmup_groups=cc.denoise_warmup_groups,
            target=cc.denoise_target,
            w_max=cc.denoise_w_max,
        ),
    )


def init_rl_state(st: RLStatics, policy_params, wm_params, policy_tx, wm_tx):
    """The whole checkpointed RL state as one pytree (numpy/jax arrays only). The correction
    state is the core's (`static_anchors`'s shared score starts at 0 before any anchor)."""
    return {
        "step": np.zeros((), np.int32),
        "policy": policy_params,
        "policy_opt": policy_tx.init(policy_params),
        "wm": wm_params,
        "wm_opt": wm_tx.init(wm_params),
        "corr": init_correction_state(st.debias, prior_reward=0.0),
        "real_episodes": np.zeros((), np.int64),
        "wm_episodes": np.zeros((), np.int64),
    }


def fused_score(means, log_vars, fuse: bool):
    """[M, N] member estimates -> ([N] WM score, [N] variance)."""
    mu, var, _ = denoise.combine_members(means, log_vars, fuse, axis=0)
    return mu, var


def within_group_auc(scores: np.ndarray, real: np.ndarray) -> tuple[float, int]:
    """Mean over groups (rows) with mixed real outcomes of the AUC of WM scores vs success
    (ties count half); returns (auc, number of such groups), NaN when none."""
    aucs = []
    for s, y in zip(scores, real, strict=False):
        pos, neg = s[y > 0.5], s[y <= 0.5]
        if len(pos) and len(neg):
            diff = pos[:, None] - neg[None, :]
            aucs.append(float(((diff > 0) + 0.5 * (diff == 0)).mean()))
    return (float(np.mean(aucs)) if aucs else float("nan")), len(aucs)


def make_policy_update(graphdef, tx, st: RLStatics):
    """Jitted PPO epochs over one batch of episodes (real and imagined alike)."""

    def loss_fn(params, ref_params, batch):
        n, c = batch["obs"].shape[:2]
        words = jnp.repeat(batch["words"], c, axis=0)
        obs = batch["obs"].reshape(n * c, -1)
        acts = batch["actions"].reshape(n * c, st.chunk)
        logp = pol.chunk_logprobs(graphdef, params, words, obs, acts).reshape(n, -1)
        ref = pol.chunk_logprobs(graphdef, ref_params, words, obs, acts).reshape(n, -1)
        loss_sum, metrics = grpo.token_policy_loss(
            logp,
            batch["logp"],
            ref,
            batch["adv"],
            batch["mask"],
            clip_eps=st.clip_eps,
            kl_coef=st.kl_coef,
        )
        return loss_sum / logp.size, metrics

    @jax.jit
    def update(params, opt_state, ref_params, batch):
        metrics = None
        for _ in range(st.ppo_epochs):
            (_, metrics), g = jax.value_and_grad(loss_fn, has_aux=True)(params, ref_params, batch)
            upd, opt_state = tx.update(g, opt_state, params)
            params = optax.apply_updates(params, upd)
        return params, opt_state, grpo.reduce_metrics(metrics)

    return update


@dataclasses.dataclass
class Trainer:
    """The jitted pieces and the numpy driver of one RL step."""

    st: RLStatics
    graphdef: object
    ref_params: object
    pool: rollout.EnvPool
    train_tasks: list
    seed: int
    policy_tx: object
    wm_tx: object
    wm_online_steps: int
    wm_batch: tuple[int, int, int, int]  # windows, episodes, unroll, value horizon
    replay_size: int
    wm_symmetries: tuple | None = None  # `world_model.square_symmetries` (object dynamics)

    def __post_init__(self):
        self.velocities = jnp.asarray(self.pool.spec.velocities())
        self.key = jax.random.PRNGKey(self.seed)
        self.policy_update = make_policy_update(self.graphdef, self.policy_tx, self.st)
        st = self.st
        self.imagine = jax.jit(
            lambda wm, params, words, task, obs0, key: wmodel.imagine(
                wm,
                self.graphdef,
                params,
                words,
                task,
                obs0,
                key,
                chunk=st.chunk,
                episode_len=st.episode_len,
                velocities=self.velocities,
                push_distance=st.push_distance,
                temperature=st.temperature,
                gate=st.contact_gate,
            )
        )

        def replay_score(wm, obs0, actions, task):
            finals, paths = wmodel.replay(wm, obs0, actions, self.velocities, st.contact_gate)
            return wmodel.score_finals(wm, obs0, finals, task, st.push_distance, paths)

        self.replay_score = jax.jit(replay_score)
        common = dict(
            episode_len=st.episode_len,
            velocities=self.velocities,
            push_distance=st.push_distance,
            gate=st.contact_gate,
        )
        self.imagine_branch = jax.jit(
            lambda wm, params, words, task, obs, t0, key: wmodel.imagine_branch(
                wm,
                self.graphdef,
                params,
                words,
                task,
                obs,
                t0,
                key,
                num_chunks=st.branch_chunks,
                chunk=st.chunk,
                temperature=st.temperature,
                **common,
            )
        )
        self.replay_value = jax.jit(
            lambda wm, obs, acts, t0, task: wmodel.replay_value(wm, obs, acts, t0, task, **common)
        )
        self.sample = jax.jit(pol.sample_chunk, static_argnums=(0,))
        self.wm_step = wmodel.make_train_step(
            self.wm_tx, self.velocities, st.push_distance, st.contact_gate
        )
        # The shared correction, jitted once per run (as the AutoResearch trainer does).
        self.correct = jax.jit(
            functools.partial(
                correct.correct_rewards,
                group_size=st.group_size,
                spec=st.spec,
                debias_cfg=st.debias,
                denoise_cfg=st.denoise,
                normalize_std=st.normalize_std,
                baseline="mean",
            )
        )

    def real_episodes(self, params, starts, key) -> rollout.Episodes:
        def act(words, obs, c):
            a, lp = self.sample(
                self.graphdef,
                params,
                jnp.asarray(words),
                jnp.asarray(obs),
                jax.random.fold_in(key, c),
                self.st.temperature,
            )
            return np.asarray(a), np.asarray(lp)

        return rollout.policy_rollouts(self.pool, starts, act, self.st.chunk)

    def step(self, state: dict, replay: dict) -> tuple[dict, dict, dict]:
        """One RL step. Returns (new state, replay, metrics)."""
        st, G, B = self.st, self.st.group_size, self.st.groups
        t = int(state["step"])
        key = jax.random.fold_in(self.key, t)
        k_route, k_real, k_wm = jax.random.split(key, 3)
        rng = np.random.default_rng([self.seed, 100, t])
        starts = rollout.sample_starts(rng, self.train_tasks, B, self.pool.spec, repeat=G)
        timing = {}
        t0 = time.monotonic()
        if st.uses_wm:
            is_anchor, _ = routing.route_anchors(k_route, B, st.routing)
            is_anchor = np.asarray(is_anchor)
        else:
            is_anchor = np.ones(B, bool)
        groups_real = np.nonzero(is_anchor)[0]
        groups_wm = np.nonzero(~is_anchor)[0]
        pick = lambda groups: [starts[g * G + i] for g in groups for i in range(G)]
        params = state["policy"]
        real = self.real_episodes(params, pick(groups_real), k_real)
        timing["real_s"] = time.monotonic() - t0
        A, nw = len(groups_real), len(groups_wm)
        # Rows in group order: the A anchor groups first, then the nw imagined ones.
        parts_obs = [real.obs[:, : st.episode_len : st.chunk]]
        parts_act, parts_logp = [real.actions], [real.logp]
        parts_words = [real.words]
        parts_mask = [np.ones(real.actions.shape, np.float32)]
        r_wm = [np.zeros(A * G, np.float32)]  # the anchors' own WM scores (below)
        metrics = {"step": t + 1, "real_success": float(real.success.mean())}
        t1 = time.monotonic()
        if st.uses_wm and st.branch_chunks:
            r_wm, im_parts = self.branched_groups(state, params, real, A, nw, t, k_wm, metrics)
            for dst, part in zip(
                (parts_obs, parts_act, parts_logp, parts_words, parts_mask), im_parts, strict=True
            ):
                dst.extend(part)
        elif st.uses_wm:
            wm = state["wm"]
            # The anchors' WM scores: their real actions replayed open-loop from the same start.
            a_mu, a_lv = self.replay_score(
                wm, jnp.asarray(real.obs[:, 0]), jnp.asarray(real.actions), jnp.asarray(real.task)
            )
            a_raw, _ = fused_score(a_mu, a_lv, st.fused)
            r_wm = [np.asarray(a_raw, np.float32)]
            if nw:
                wstarts = pick(groups_wm)
                words = np.stack([rollout.scene.encode_instruction(s.task) for s in wstarts])
                task = np.asarray([rollout.task_index(s.task) for s in wstarts], np.int32)
                obs0 = np.stack([rollout.scene.make_obs(s) for s in wstarts])
                im = self.imagine(
                    wm, params, jnp.asarray(words), jnp.asarray(task), jnp.asarray(obs0), k_wm
                )
                raw, var = fused_score(im["means"], im["log_vars"], st.fused)
                parts_obs.append(np.asarray(im["obs"]))
                parts_act.append(np.asarray(im["actions"]))
                parts_logp.append(np.asarray(im["logp"]))
                parts_words.append(words)
                parts_mask.append(trusted_tokens(np.asarray(im["spread"]), st))
                metrics["wm_trusted_tokens"] = float(parts_mask[-1].mean())
                r_wm.append(np.asarray(raw, np.float32))
                metrics["imagined_success"] = float(np.mean(raw))
                metrics["wm_variance"] = float(np.mean(var))
        timing["wm_score_s"] = time.monotonic() - t1
        # ---- the shared correction (rewards, advantages, anchor weight) and the update
        t2 = time.monotonic()
        n = (A + nw) * G
        anchor_rows = np.arange(n) < A * G
        r_env = np.zeros(n, np.float32)
        r_env[: A * G] = real.success
        res = self.correct(
            state["corr"],
            correct.StepInputs(
                r_wm=jnp.asarray(np.concatenate(r_wm)),
                r_env=jnp.asarray(r_env),
                env_valid=jnp.asarray(anchor_rows),
                anchor_groups=jnp.asarray(np.arange(A + nw) < A),
                anchor_index=jnp.arange(A),
            ),
        )
        corr, stats = res.correction, res.stats
        if st.uses_wm:
            cal = np.asarray(res.calibrated)
            ra, rc = np.asarray(r_wm[0]).reshape(A, G), cal[: A * G].reshape(A, G)
            auc, n_auc = within_group_auc(ra, real.success.reshape(A, G))
            metrics.update(
                anchor_auc=auc,
                anchor_auc_groups=n_auc,
                anchor_wm_score=float(ra.mean()),
                anchor_wm_calibrated=float(rc.mean()),
                bias_before=float(stats.residual_before),
                bias_reduction=float(stats.bias_reduction),
                calibrated=bool(stats.calibrated),
                wm_stream_corr=float(stats.wm_stream_corr),
                wm_stream_collapsed_groups=int(stats.wm_stream_collapsed_groups),
            )
            if nw:
                metrics["imagined_success_calibrated"] = float(np.mean(cal[A * G :]))
                metrics["wm_groups_flat"] = flat_fraction(cal[A * G :], G)
        batch = {
            "words": jnp.asarray(np.concatenate(parts_words)),
            "obs": jnp.asarray(np.concatenate(parts_obs)),
            "actions": jnp.asarray(np.concatenate(parts_act)),
            "logp": jnp.asarray(np.concatenate(parts_logp)),
            "adv": res.advantages,
            "mask": jnp.asarray(np.concatenate(parts_mask)),
        }
        new_params, opt, pm = self.policy_update(
            params, state["policy_opt"], self.ref_params, batch
        )
        timing["train_s"] = time.monotonic() - t2
        new = {
            **state,
            "policy": new_params,
            "policy_opt": opt,
            "step": np.asarray(t + 1, np.int32),
        }
        new["real_episodes"] = np.asarray(int(state["real_episodes"]) + A * G, np.int64)
        new["wm_episodes"] = np.asarray(int(state["wm_episodes"]) + nw * G, np.int64)
        metrics.update({k: float(v) for k, v in pm.items()})
        metrics.update(
            anchor_weight=float(stats.anchor_weight),
            anchor_groups=A,
            wm_groups=nw,
            train_reward=float(stats.train_reward),
        )
        if st.uses_wm:
            t3 = time.monotonic()
            new["corr"] = corr
            replay = add_to_replay(replay, real, self.replay_size, st.push_distance)
            new["wm"], new["wm_opt"], wmm = self.fine_tune_wm(
                state["wm"], state["wm_opt"], replay, t
            )
            metrics.update(wmm)
            timing["wm_train_s"] = time.monotonic() - t3
        metrics["real_episodes"] = int(new["real_episodes"])
        metrics["wm_episodes"] = int(new["wm_episodes"])
        metrics.update(timing)
        return new, replay, metrics

    def branched_groups(self, state, params, real, A, nw, t, key, metrics):
        """`wm.branch_chunks` = k > 0: every WM group is G imagined branches of k chunks from
        one real state of this step's anchor episodes (an episode and a chunk boundary drawn
        per group), scored by the success-to-go head; nothing steps the simulator. An anchor
        group's pairs are the same score of its own episodes: their next k chunks of real
        actions replayed from the state at one chunk boundary per group, against their real
        outcome. Returns (r_wm parts, the batch parts of the WM rows): a branch row carries
        its source episode's real prefix and imagined branch; only the branch's tokens carry
        loss (and, with `rl.wm_trust_spread`, only its trusted ones)."""
        st, G = self.st, self.st.group_size
        H, C, k = st.chunk, st.episode_len // st.chunk, st.branch_chunks
        h = k * H
        rng = np.random.default_rng([self.seed, 300, t])
        wm = state["wm"]
        rows = np.arange(A * G)
        ja = np.repeat(rng.integers(0, C - k + 1, A), G)  # one boundary per anchor group
        t_a = ja * H
        a_obs = real.obs[rows, t_a]
        a_act = real.actions[rows[:, None], t_a[:, None] + np.arange(h)]
        a_mu, a_lv = self.replay_value(
            wm,
            jnp.asarray(a_obs),
            jnp.asarray(a_act),
            jnp.asarray(t_a, jnp.float32),
            jnp.asarray(real.task),
        )
        a_raw, _ = fused_score(a_mu, a_lv, st.fused)
        r_wm = [np.asarray(a_raw, np.float32)]
        if not nw:
            return r_wm, ([], [], [], [], [])
        src = rng.choice(A * G, nw, replace=nw > A * G)
        jw = rng.integers(0, C - k + 1, nw)
        src, jw = np.repeat(src, G), np.repeat(jw, G)
        t_w = jw * H
        words, task = real.words[src], real.task[src]
        im = self.imagine_branch(
            wm,
            params,
            jnp.asarray(words),
            jnp.asarray(task),
            jnp.asarray(real.obs[src, t_w]),
            jnp.asarray(t_w, jnp.float32),
            key,
        )
        raw, var = fused_score(im["means"], im["log_vars"], st.fused)
        n = nw * G
        obs = real.obs[src, : st.episode_len : H].copy()
        acts, logp = real.actions[src].copy(), real.logp[src].copy()
        mask = np.zeros(acts.shape, np.float32)
        chunk_rows = np.arange(n)[:, None]
        obs[chunk_rows, jw[:, None] + np.arange(k)] = np.asarray(im["obs"])
        tok = t_w[:, None] + np.arange(h)
        acts[chunk_rows, tok] = np.asarray(im["actions"])
        logp[chunk_rows, tok] = np.asarray(im["logp"])
        mask[chunk_rows, tok] = trusted_tokens(np.asarray(im["spread"]), st)
        metrics.update(
            wm_trusted_tokens=float(mask[chunk_rows, tok].mean()),
            imagined_success=float(np.mean(raw)),
            wm_variance=float(np.mean(var)),
            branch_start_chunk=float(jw.mean()),
        )
        r_wm.append(np.asarray(raw, np.float32))
        return r_wm, ([obs], [acts], [logp], [words], [mask])

    def fine_tune_wm(self, wm, opt, replay, t):
        rng = np.random.default_rng([self.seed, 200, t])
        m = jax.tree.leaves(wm)[0].shape[0]
        out = {}
        for _ in range(self.wm_online_steps):
            b = wmodel.make_batch(rng, replay, m, *self.wm_batch, self.wm_symmetries)
            wm, opt, out = self.wm_step(wm, opt, b)
        return wm, opt, {f"wm_{k}": float(v) for k, v in out.items()}


def flat_fraction(rewards: np.ndarray, group_size: int) -> float:
    """Fraction of groups whose G rewards are all equal (no GRPO signal: zero advantages)."""
    g = np.asarray(rewards).reshape(-1, group_size)
    return float((g.max(1) - g.min(1) <= 1e-7).mean())


def trusted_tokens(spread: np.ndarray, st: RLStatics) -> np.ndarray:
    """[N, C] members' spread on the imagined states the policy read -> [N, T] token mask of
    an imagined episode: 1 up to the first chunk whose state the members disagree on by
    `rl.wm_trust_spread` (m) or more, 0 from there on (the tokens the policy emitted on states
    the WM cannot vouch for carry no loss); all 1 when `wm_trust_spread` is 0 (off)."""
    if st.wm_trust_spread <= 0:
        return np.ones((spread.shape[0], spread.shape[1] * st.chunk), np.float32)
    ok = np.cumprod(spread < st.wm_trust_spread, axis=1).astype(np.float32)
    return np.repeat(ok, st.chunk, axis=1)


def add_to_replay(replay: dict, eps: rollout.Episodes, size: int, push_distance: float) -> dict:
    new = wmodel.episode_data(eps.obs, eps.actions, eps.task, eps.success, push_distance)
    return {k: np.concatenate([replay[k], new[k]])[-size:] for k in replay}
