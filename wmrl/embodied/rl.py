"""GRPO post-training of the chunk policy with WMRL's correction, modes from the same code.

One RL step (docs/method.md 3, embodied):
  1. B start states (instruction + layout) from the training tasks, G rollouts each (a group).
  2. Route: `wmrl.core.routing.route_anchors` picks whole anchor groups (seeded by seed and
     step). Mode `real` executes every group.
  3. Anchor groups run in MuJoCo (real executions, one simulator episode each, sparse
     success); every other group is imagined by the world model with the policy in the loop
     (`world_model.imagine`) and never steps the simulator. Anchors are also replayed
     through the WM: (WM score, real success) pairs of the same trajectories. With
     `wm.branch_chunks` = k > 0 a WM group is instead G imagined k-chunk branches from one
     real state of this step's anchor episodes (`Trainer.branched_groups`), scored by the
     success-to-go head.
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
(tests/embodied/test_e2e.py spies on `correct` during a run).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from wmrl.core import correct, debias, denoise, grpo, routing
from wmrl.core.state import init_correction_state
from wmrl.core.stats import within_group_auc
from wmrl.embodied import policy as pol
from wmrl.embodied import rollout
from wmrl.embodied import wm_training as wmtrain
from wmrl.embodied import world_model as wmodel
from wmrl.experiment.step import PhaseClock, StepKeys, run_step

# The shared table (`wmrl.core.correct.MODE_SPECS`), every mode with the switches it has in
# every experiment. `static_anchors` is the constant-score control; this setting has no
# static check, so it is the same anchors with one shared score for every WM episode, and
# `permuted_wm` permutes the calibrated WM scores of every WM group's episodes.
MODE_SPECS = correct.MODE_SPECS


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
    """The step's settings from a config (a ConfigDict, validated, or the typed config)."""
    from wmrl.embodied.config import parse_config

    cfg = parse_config(config)
    cc = cfg.correction
    return RLStatics(
        mode=cfg.mode,
        groups=cfg.rl.groups_per_step,
        group_size=cfg.rl.group_size,
        chunk=cfg.policy.chunk,
        episode_len=cfg.env.episode_len,
        temperature=cfg.rl.temperature,
        clip_eps=cfg.rl.clip_eps,
        kl_coef=cfg.rl.kl_coef,
        normalize_std=cfg.rl.normalize_std,
        ppo_epochs=cfg.rl.ppo_epochs,
        push_distance=cfg.env.push_distance,
        contact_gate=cfg.wm.contact_gate,
        wm_trust_spread=cfg.rl.wm_trust_spread,
        branch_chunks=cfg.wm.branch_chunks,
        sample_fusion=cc.sample_fusion,
        routing=routing.RoutingConfig(rho=cc.rho, min_groups=cc.min_groups),
        debias=cc.debias_config(cc.debias if MODE_SPECS[cfg.mode].debias else "none", num_keys=12),
        denoise=cc.denoise_config(),
    )


class Starts(NamedTuple):
    """sample: the step's start states, G per group (groups contiguous)."""

    step: int
    starts: list


class BatchParts(NamedTuple):
    """The policy batch's rows, in parts (the anchor groups' real episodes first)."""

    obs: list
    actions: list
    logp: list
    words: list
    mask: list


class Acted(NamedTuple):
    """act: the real episodes of the A anchor groups, the nw WM groups' rows, the raw WM
    scores and the correction's input."""

    real: rollout.Episodes
    A: int
    nw: int
    parts: BatchParts
    anchor_wm: np.ndarray  # [A*G] the anchors' own raw WM scores (their pairs)
    inputs: correct.StepInputs
    metrics: dict


class Updated(NamedTuple):
    policy: object
    policy_opt: object
    policy_metrics: dict
    wm: object
    wm_opt: object
    wm_metrics: dict
    replay: dict


def _step(st) -> int:
    """The step `st` = (state, replay) starts (0-based)."""
    return int(st[0]["step"])


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
        "real_executions": np.zeros((), np.int64),  # simulator episodes, one per execution
        "wm_episodes": np.zeros((), np.int64),
    }


def fused_score(means, log_vars, fuse: bool):
    """[M, N] member estimates -> ([N] WM score, [N] variance)."""
    mu, var, _ = denoise.combine_members(means, log_vars, fuse, axis=0)
    return mu, var


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
    wm_symmetries: tuple | None = None  # `wm_training.square_symmetries` (object dynamics)

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
        self.sample_actions = jax.jit(pol.sample_chunk, static_argnums=(0,))
        self.wm_step = wmtrain.make_train_step(
            self.wm_tx, self.velocities, st.push_distance, st.contact_gate
        )
        # The shared correction, jitted once per run (as the AutoResearch trainer does).
        self.correct_rewards = jax.jit(
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

    def execute(self, params, starts, key) -> rollout.Episodes:
        """The policy's episodes from `starts` in the simulator (real executions)."""

        def act(words, obs, c):
            a, lp = self.sample_actions(
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
        """One RL step (`wmrl.experiment.step.run_step` over the phases below). Returns (new
        state, replay, metrics)."""
        (state, replay), metrics, _ = run_step(self, (state, replay))
        return state, replay, metrics

    # -- the phases of one step; `st` is (state, replay) ----------------------------------

    def clock(self) -> PhaseClock:
        return PhaseClock()

    def keys(self, st) -> StepKeys:
        k_route, k_real, k_wm = jax.random.split(jax.random.fold_in(self.key, _step(st)), 3)
        return StepKeys(sample=None, route=k_route, act=(k_real, k_wm))

    def sample(self, st, key, clock) -> Starts:
        """sample: B start states (instruction + layout) from the training tasks, G each."""
        t = _step(st)
        rng = np.random.default_rng([self.seed, 100, t])
        starts = rollout.sample_starts(rng, self.train_tasks, self.st.groups, self.pool.spec,
                                       repeat=self.st.group_size)  # fmt: skip
        return Starts(t, starts)

    def route(self, st, s: Starts, key, clock) -> np.ndarray:
        """route: [B] bool, the anchor groups (every group in `real`)."""
        if not self.st.uses_wm:
            return np.ones(self.st.groups, bool)
        with clock("real_s"):
            return np.asarray(routing.route_anchors(key, self.st.groups, self.st.routing)[0])

    def act(self, st, s: Starts, is_anchor: np.ndarray, key, clock) -> Acted:
        """act: the anchor groups roll out in MuJoCo, every other group is imagined by the
        world model with the policy in the loop (or branched from a real state, with
        `wm.branch_chunks`); the anchors are also scored by the WM for their pairs. Rows in
        group order: the A anchor groups first, then the imagined ones."""
        (state, _), cfg, G = st, self.st, self.st.group_size
        k_real, k_wm = key
        groups_real, groups_wm = np.nonzero(is_anchor)[0], np.nonzero(~is_anchor)[0]
        pick = lambda groups: [s.starts[g * G + i] for g in groups for i in range(G)]
        params = state["policy"]
        with clock("real_s"):
            real = self.execute(params, pick(groups_real), k_real)
        A, nw = len(groups_real), len(groups_wm)
        parts = BatchParts(
            obs=[real.obs[:, : cfg.episode_len : cfg.chunk]], actions=[real.actions],
            logp=[real.logp], words=[real.words], mask=[np.ones(real.actions.shape, np.float32)],
        )  # fmt: skip
        r_wm = [np.zeros(A * G, np.float32)]  # the anchors' own WM scores (below)
        metrics = {"step": s.step + 1, "real_success": float(real.success.mean())}
        with clock("wm_score_s"):
            if cfg.uses_wm and cfg.branch_chunks:
                r_wm, im_parts = self.branched_groups(
                    state, params, real, A, nw, s.step, k_wm, metrics
                )
                for dst, part in zip(parts, im_parts, strict=True):
                    dst.extend(part)
            elif cfg.uses_wm:
                r_wm = self._imagined_groups(state, params, real, pick(groups_wm), k_wm,
                                             parts, metrics)  # fmt: skip
        n = (A + nw) * G
        anchor_rows = np.arange(n) < A * G
        r_env = np.zeros(n, np.float32)
        r_env[: A * G] = real.success
        inputs = correct.StepInputs(
            r_wm=jnp.asarray(np.concatenate(r_wm)),
            r_env=jnp.asarray(r_env),
            env_valid=jnp.asarray(anchor_rows),
            anchor_groups=jnp.asarray(np.arange(A + nw) < A),
            anchor_index=jnp.arange(A),
            # `permuted_wm`: the step's draw, folded from the step's key as `keys` folds it
            permute_key=correct.permutation_key(jax.random.fold_in(self.key, s.step))
            if cfg.spec.permute else None,
        )  # fmt: skip
        return Acted(real, A, nw, parts, r_wm[0], inputs, metrics)

    def _imagined_groups(self, state, params, real, wstarts, key, parts, metrics) -> list:
        """The anchors' WM scores (their real actions replayed open loop from the same
        start) and the imagined episodes of the WM groups from `wstarts` (their batch rows
        appended to `parts`): the raw WM scores, anchors first."""
        cfg, wm = self.st, state["wm"]
        a_mu, a_lv = self.replay_score(
            wm, jnp.asarray(real.obs[:, 0]), jnp.asarray(real.actions), jnp.asarray(real.task)
        )
        a_raw, _ = fused_score(a_mu, a_lv, cfg.fused)
        r_wm = [np.asarray(a_raw, np.float32)]
        if not wstarts:
            return r_wm
        words = np.stack([rollout.scene.encode_instruction(s.task) for s in wstarts])
        task = np.asarray([rollout.task_index(s.task) for s in wstarts], np.int32)
        obs0 = np.stack([rollout.scene.make_obs(s) for s in wstarts])
        im = self.imagine(wm, params, jnp.asarray(words), jnp.asarray(task), jnp.asarray(obs0), key)
        raw, var = fused_score(im["means"], im["log_vars"], cfg.fused)
        parts.obs.append(np.asarray(im["obs"]))
        parts.actions.append(np.asarray(im["actions"]))
        parts.logp.append(np.asarray(im["logp"]))
        parts.words.append(words)
        parts.mask.append(trusted_tokens(np.asarray(im["spread"]), cfg))
        metrics["wm_trusted_tokens"] = float(parts.mask[-1].mean())
        r_wm.append(np.asarray(raw, np.float32))
        metrics["imagined_success"] = float(np.mean(raw))
        metrics["wm_variance"] = float(np.mean(var))
        return r_wm

    def correct(self, st, is_anchor, a: Acted, clock) -> correct.StepCorrection:
        """correct: the shared correction (`wmrl.core.correct.correct_rewards`)."""
        with clock("train_s"):
            return self.correct_rewards(st[0]["corr"], a.inputs)

    def update(self, st, is_anchor, a: Acted, res: correct.StepCorrection, clock) -> Updated:
        """update: PPO epochs on every row (real and imagined alike); the WM's online steps on
        the replay of real episodes."""
        state, replay = st
        batch = {
            "words": jnp.asarray(np.concatenate(a.parts.words)),
            "obs": jnp.asarray(np.concatenate(a.parts.obs)),
            "actions": jnp.asarray(np.concatenate(a.parts.actions)),
            "logp": jnp.asarray(np.concatenate(a.parts.logp)),
            "adv": res.advantages,
            "mask": jnp.asarray(np.concatenate(a.parts.mask)),
        }
        with clock("train_s"):
            params, opt, pm = self.policy_update(
                state["policy"], state["policy_opt"], self.ref_params, batch
            )
        wm, wm_opt, wmm = state["wm"], state["wm_opt"], {}
        if self.st.uses_wm:
            with clock("wm_train_s"):
                replay = add_to_replay(replay, a.real, self.replay_size, self.st.push_distance)
                wm, wm_opt, wmm = self.fine_tune_wm(wm, wm_opt, replay, int(state["step"]))
        return Updated(params, opt, pm, wm, wm_opt, wmm, replay)

    def finish(self, st, s: Starts, is_anchor, a: Acted, res, u: Updated, clock):
        """The new state and the step's metrics (no records beside metrics.jsonl)."""
        state, G = st[0], self.st.group_size
        A, nw, metrics = a.A, a.nw, dict(a.metrics)
        stats = res.stats
        if self.st.uses_wm:
            cal = np.asarray(res.calibrated)
            ra, rc = a.anchor_wm.reshape(A, G), cal[: A * G].reshape(A, G)
            auc, n_auc = within_group_auc(ra, a.real.success.reshape(A, G) > 0.5)
            metrics.update(
                anchor_auc=auc,
                anchor_auc_groups=n_auc,
                anchor_wm_score=float(ra.mean()),
                anchor_wm_calibrated=float(rc.mean()),
                residual_before=float(stats.residual_before),
                bias_reduction=float(stats.bias_reduction),
                calibrated=bool(stats.calibrated),
                wm_stream_corr=float(stats.wm_stream_corr),
                wm_stream_collapsed_groups=int(stats.wm_stream_collapsed_groups),
            )
            if nw:
                metrics["imagined_success_calibrated"] = float(np.mean(cal[A * G :]))
                metrics["wm_groups_flat"] = flat_fraction(cal[A * G :], G)
        new = {**state, "policy": u.policy, "policy_opt": u.policy_opt,
               "step": np.asarray(s.step + 1, np.int32)}  # fmt: skip
        new["real_executions"] = np.asarray(int(state["real_executions"]) + A * G, np.int64)
        new["wm_episodes"] = np.asarray(int(state["wm_episodes"]) + nw * G, np.int64)
        metrics.update({k: float(v) for k, v in u.policy_metrics.items()})
        metrics.update(
            anchor_weight=float(stats.anchor_weight),
            anchor_groups=A,
            wm_groups=nw,
            train_reward=float(stats.train_reward),
        )
        if self.st.uses_wm:
            new.update(corr=res.correction, wm=u.wm, wm_opt=u.wm_opt)
            metrics.update(u.wm_metrics)
        metrics["real_executions"] = int(new["real_executions"])
        metrics["wm_episodes"] = int(new["wm_episodes"])
        metrics.update(clock.seconds)
        return (new, u.replay), metrics, []

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
            b = wmtrain.make_batch(rng, replay, m, *self.wm_batch, self.wm_symmetries)
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
    new = wmtrain.episode_data(eps.obs, eps.actions, eps.task, eps.success, push_distance)
    return {k: np.concatenate([replay[k], new[k]])[-size:] for k in replay}
