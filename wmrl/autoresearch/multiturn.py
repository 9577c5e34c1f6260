"""Multi-turn episodes (docs/method.md 4): the agent revises its script from feedback.

`MultiTurnTrainer` is the `Trainer` of `env.turns` = K > 1 (K = 1 runs the single-turn
`Trainer` itself, unchanged). One RL step rolls out the step's N = B*G episodes turn by turn:

1. **Generate** turn t's script for every episode: turn 1 from the task card (G samples per
   task, as single-turn), turn t > 1 from the card plus that episode's history
   (`wmrl.autoresearch.history`), one sample per episode.
2. **Route** (once, after turn 1: uncertainty routing reads the WM's variance on turn 1)
   whole groups of episodes to real execution, as single-turn.
3. **Observe**: anchor episodes execute turn t for real on their episode task (a validation
   split carved from train.csv, `episode.make_episode_task`): the real observation
   (`observation.observation_of`) and the turn's ladder reward on the hidden test labels;
   every other episode's observation is written by the world model
   (`wm_observation.predict_observation`, the static check overriding what it knows), rendered
   by the same template. The WM scores every turn (its per-turn reward) while the anchors
   execute.
4. After K turns: the trajectory's real reward is the max over turns of the ladder reward;
   its WM reward the max over turns of the per-turn WM rewards. The monotone map `f` of
   Online Debiasing is strictly increasing, so `max_t f(r_t) = f(max_t r_t)`: the max of the
   calibrated per-turn rewards is the calibrated max, and the estimator fits on exactly the
   (trajectory WM reward, trajectory real reward) pairs of the anchor episodes, through the
   single-turn `correct_rewards` unchanged. A turn the static check fixes does not enter
   the WM max; an episode whose every turn it fixes takes the best fixed reward.
5. **Update**: every turn is one training row `[prompt of turn t | script of turn t]`, the
   episode's advantage on each of its K rows; the prompt (the card, the earlier scripts and
   every observation) carries no loss, only the agent's own tokens of each turn. The WM is
   fine-tuned on every real turn of the anchor episodes (their real observations' targets).

Anchors are synchronous for K > 1 (`rl.anchor_lag` must be 0): an anchor episode's turn t+1
is sampled from its turn t's real observation, so nothing of it can run a step behind.
Every real turn is journalled with its observation (`anchors.jsonl`, rows `t*N + i`), so a
step redone after preemption rebuilds the same prompts from the journal without executing
again; held-out episodes likewise (`heldout.jsonl`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from wmrl import distributed
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import evaluation, execution, history, pretrained
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.autoresearch.env.observation import (
    ERROR_TYPES,
    Observation,
    make_observation,
    observation_of,
    render_observation,
)
from wmrl.autoresearch.state import RunState
from wmrl.autoresearch.step import (
    Corrected,
    Exchanged,
    Routed,
    Sampled,
    Updated,
    anchor_pairs,
    static_outcomes,
    step_metrics,
)
from wmrl.autoresearch.trainer import Trainer
from wmrl.core.correct import StepInputs
from wmrl.experiment.step import PhaseClock
from wmrl.models.sampler import generate

UNGRADED = int(Status.UNGRADED)
# What the warm-up's compile pass of `real` (no WM, nothing executed) puts in its prompts.
NO_OBSERVATION = make_observation(Status.UNGRADED, "none", 0.0, None)


class Episodes(NamedTuple):
    """The K turns of the step's N episodes (turn-major; G episodes per task)."""

    rows: list[dict]  # [K] rows of each turn, as Sampled.rows ([N, L])
    scripts: list[list[str]]  # [K][N]
    observations: list[list[Observation]]  # [K][N] what each turn's script got
    status: np.ndarray  # [K, N] int32 real status (UNGRADED where not executed)
    reward: np.ndarray  # [K, N] float32 real ladder reward (0 where not executed)
    r_wm: np.ndarray  # [K, N] float32 raw per-turn WM rewards (0 without a WM)
    # [K, N] float32 the WM's per-turn P(timeout) under the turn's limit (NaN: no WM, or a WM
    # without a runtime head)
    p_timeout: np.ndarray
    obs_arrays: dict  # [K, N] real turns: runtime_s (raw, NaN), error_type index (-1), validation
    new_executions: int  # real turns not taken from a journal


def best_of_turns(reward: np.ndarray, status: np.ndarray):
    """Per episode `[N]`: the best turn's reward and status and the turn (first best); an
    episode with an UNGRADED turn (infrastructure failure) is UNGRADED. reward, status
    `[K, N]`."""
    best = np.argmax(reward, axis=0)
    cols = np.arange(reward.shape[1])
    ungraded = (status == UNGRADED).any(axis=0)
    r = np.where(ungraded, 0.0, reward[best, cols]).astype(reward.dtype)
    s = np.where(ungraded, UNGRADED, status[best, cols]).astype(np.int32)
    return r, s, best


def reward_by_turn(reward: np.ndarray, graded: np.ndarray) -> list[float | None]:
    """`[K]`: the mean over graded episodes of the best reward of their first t turns."""
    if not graded.any():
        return [None] * len(reward)
    best = np.maximum.accumulate(reward[:, graded], axis=0)
    return [float(v) for v in best.mean(axis=1)]


def improved_fraction(reward: np.ndarray, graded: np.ndarray) -> float | None:
    """The fraction of graded episodes whose later turns beat turn 1 (K > 1)."""
    if not graded.any() or len(reward) < 2:
        return None
    r = reward[:, graded]
    return float(np.mean(r[1:].max(axis=0) > r[0]))


def observations_from_arrays(a: dict[str, np.ndarray]) -> list[Observation]:
    """The observations of real turns from their merged arrays (`_collect_turns`), rounded
    and checked by the one constructor (an unknown runtime reads 0 s)."""
    return [
        make_observation(
            int(s), ERROR_TYPES[int(e)] if e >= 0 else "none",
            float(r) if math.isfinite(r) else 0.0, None if math.isnan(v) else float(v),
        )
        for s, e, r, v in zip(a["status"], a["error_type"], a["runtime_s"], a["validation"],
                              strict=True)
    ]  # fmt: skip


class EpisodeStep(NamedTuple):
    """act (multi-turn): the rolled-out episodes, and the step's batch of every turn's rows
    (`Sampled` as the single-turn record, the last turn's scripts) with its exchange."""

    episodes: Episodes
    sampled: Sampled
    exchanged: Exchanged
    static: np.ndarray  # [K, N] per-turn static verdicts (`_static`), -1 where execution tells


def observed_fields(res) -> dict:
    """What a real turn's journal record keeps: its observation's runtime, error type and
    validation (`observation.observation_of`: checked and rounded, as the next turn's prompt
    shows them)."""
    obs = observation_of(res)
    return {"runtime_s": res.runtime_s, "error_type": obs.error_type, "validation": obs.validation}


class MultiTurnTrainer(Trainer):
    """The RL step and the held-out evaluation over K-turn episodes (module docstring)."""

    def __init__(self, config, prepared, policy, wm, pool, workdir: Path):
        super().__init__(config, prepared, policy, wm, pool, workdir)
        self.K = self.tc.turns
        self.sc_one = dataclasses.replace(self.sc, num_samples=1)
        tasks = self.train + prepared.heldout_tasks
        # The episode task of every suite task (built once in the data stage's folder): a
        # validation split carved from train.csv (fixed per task, seeded by its id), test.csv
        # holding the test rows (the reward) and the validation rows. The agent's card is the
        # episode task's (its row counts).
        # K = 1 (the single-turn trainer's equivalence test) keeps the single-turn tasks.
        self.episode_tasks = prepared.episode_tasks if self.K > 1 else {t.id: t for t in tasks}
        ep_text = {t.id: rldata.prompt_text(self.episode_tasks[t.id]) for t in tasks}
        self.prompts = {i: pretrained.prompt(config, text) for i, text in ep_text.items()}
        self.cards = {i: history.card_of(text) for i, text in ep_text.items()}
        self.metric_names = {t.id: t.metric_name for t in tasks}

    # -- prompts and generation ----------------------------------------------------------

    def _fits(self, text: str) -> bool:
        return len(self.tok.encode(pretrained.prompt(self.config, text), add_bos=True)) <= self.P

    def turn_prompt(self, task, past: list[tuple[str, Observation]]) -> str:
        """The prompt of turn `len(past) + 1` of an episode of `task`
        (`wmrl.autoresearch.history`)."""
        rendered = [(s, render_observation(o, self.metric_names[task.id])) for s, o in past]
        text = history.turn_prompt(self.cards[task.id], rendered, self._fits)
        return pretrained.prompt(self.config, text)

    def _generate_texts(self, params, prompts: list[str], key):
        """One script per prompt; rows in the shared layout (as `Trainer._generate`)."""
        ids, mask = rldata.encode_prompts(self.tok, prompts, self.P)
        out = generate(
            self.policy.graphdef, params, jnp.asarray(ids), jnp.asarray(mask), key, self.sc_one,
            self.max_len,
        )  # fmt: skip
        comp, cmask, logp = distributed.process_allgather_to_numpy(
            (out.tokens, out.mask, out.logprobs)
        )
        n = len(comp)
        rows = {
            "tokens": np.concatenate([ids, comp], axis=1),
            "input_mask": np.concatenate([mask, cmask], axis=1),
            "loss_mask": np.concatenate(
                [np.zeros((n, self.P), np.float32), cmask.astype(np.float32)], axis=1
            ),
            "old_logp": np.concatenate([np.zeros((n, self.P), np.float32), logp * cmask], axis=1),
        }
        return rows, self._decode(comp, cmask)

    def _turn(self, params, t: int, tasks, row_tasks, past, sc, key):
        """Turn t (0-based) of every episode: rows and scripts. Turn 1 is sampled exactly as
        single-turn (G samples per task from the card, with the step's own key)."""
        if t == 0:
            return self._generate(params, tasks, sc, key)
        prompts = [self.turn_prompt(task, p) for task, p in zip(row_tasks, past, strict=True)]
        return self._generate_texts(params, prompts, jax.random.fold_in(key, t))

    # -- real execution ------------------------------------------------------------------

    def _submit_turns(self, journal, step: int, rows, tasks, scripts, kind: str):
        """This process's round-robin share of real turns to the pool on their episode tasks
        (`execution.submit`); `rows` are the journal keys, `kind` names the execution seeds
        (anchor / eval)."""
        sandbox_task = lambda task: self.episode_tasks[task.id]
        return execution.submit(journal, self.pool, step, rows, tasks, scripts, kind, sandbox_task)

    def _collect_turns(self, journal, ex: execution.Execution) -> tuple[dict, int]:
        """Wait for this process's turns (journalling each with its observation fields) and
        merge every process's (`execution.collect`)."""
        return execution.collect(journal, ex, observed_fields)

    # -- the WM's observations -----------------------------------------------------------

    def _wm_turn(self, st, rows: dict, scripts: list[str], row_tasks, observe: bool):
        """The WM's per-turn rewards [N], its P(timeout) [N] under each row's limit (NaN
        without a runtime head) and (with `observe`) observations [N] of every row: every
        field from a head (`wmrl.autoresearch.wm_observation.predict_observation`), the static
        check fixing what it knows."""
        tasks = [self.episode_tasks[t.id] for t in row_tasks]
        limits = np.array([rldata.time_limit(t, self.tc.time_limit_cap_s) for t in tasks])
        out = self.wm_score(
            st.wm.params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"]), limits,
            outputs=observe,
        )  # fmt: skip
        out = distributed.process_allgather_to_numpy(dict(out))
        score = np.asarray(out["score"], np.float32)
        p_timeout = np.asarray(out.get("p_timeout", np.full(len(scripts), np.nan)), np.float32)
        if not observe:
            return score, p_timeout, [None] * len(scripts)
        from wmrl.autoresearch.wm_observation import predict_observation

        static = self.tc.static_check if self.static_check else "off"
        obs = predict_observation(out, tasks, scripts, limits, static=static)
        return score, p_timeout, list(obs)

    # -- the rollout ---------------------------------------------------------------------

    def rollout(self, st: RunState, s: Sampled, routed: Routed, key, clock, execute=True):
        """The K turns of the step's episodes from their first turn `s` (sampled as
        single-turn, then routed). With `execute` False (the warm-up's compile pass) no script
        runs: every observation is the WM's."""
        K, G = self.K, self.G
        N = len(s.scripts)
        row_tasks = s.row_tasks
        tasks = row_tasks[::G]
        past = [[] for _ in range(N)]
        rows_k, scripts_k, obs_k = [], [], []
        status = np.full((K, N), UNGRADED, np.int32)
        reward = np.zeros((K, N), np.float32)
        r_wm = np.zeros((K, N), np.float32)
        p_timeout = np.full((K, N), np.nan, np.float32)
        real = {"runtime_s": np.full((K, N), np.nan, np.float32),
                "error_type": np.full((K, N), -1, np.int32),
                "validation": np.full((K, N), np.nan, np.float32)}  # fmt: skip
        new = 0
        for t in range(K):
            if t == 0:
                rows, scripts = s.rows, s.scripts
            else:
                with clock("generate_s"):
                    params = st.policy.params
                    rows, scripts = self._turn(params, t, tasks, row_tasks, past, self.sc, key)
            idx = routed.anchor_idx if execute else np.zeros(0, np.int64)
            with clock("execute_s"):  # submission to collection, as single-turn
                ex = self._submit_turns(
                    self.journal, st.step, t * N + idx, [row_tasks[i] for i in idx],
                    [scripts[i] for i in idx], "anchor",
                )  # fmt: skip
                obs = [None] * N
                if self.spec.uses_wm:  # while the anchors execute
                    with clock("wm_score_s"):
                        # The last turn's observation is read by no one: its reward only.
                        r_wm[t], p_timeout[t], obs = self._wm_turn(
                            st, rows, scripts, row_tasks, t < K - 1
                        )
                with clock("anchor_wait_s"):
                    got, n_new = self._collect_turns(self.journal, ex)
            new += n_new
            status[t, idx] = got["status"]
            reward[t, idx] = np.nan_to_num(got["reward"]).astype(np.float32)
            for name in real:
                real[name][t, idx] = got[name]
            for j, o in zip(idx, observations_from_arrays(got), strict=True):
                obs[j] = o
            if not execute and not self.spec.uses_wm:  # compile pass of `real`: no feedback
                obs = [NO_OBSERVATION] * N
            for i in range(N):
                past[i].append((scripts[i], obs[i]))
            rows_k.append(rows)
            scripts_k.append(scripts)
            obs_k.append(obs)
        return Episodes(rows_k, scripts_k, obs_k, status, reward, r_wm, p_timeout, real, new)

    # -- one RL step ---------------------------------------------------------------------

    # The phases of `wmrl.experiment.step.run_step` (`Trainer.run_step`): `sample` (turn 1,
    # as single-turn), `route` and `keys` are the single-turn trainer's.

    def act(self, st: RunState, s: Sampled, r: Routed, key, clock) -> EpisodeStep:
        """act: the episodes' later turns (the anchors' executed, the others' observed by the
        WM) and the step's training rows."""
        ep = self.rollout(st, s, r, key, clock)
        with clock("train_s"):
            sampled, x = self._episode_batch(st, s.row_tasks[:: self.G], ep, r)
            static = self._static(ep, r)
        return EpisodeStep(ep, sampled, x, static)

    def correct(self, st: RunState, r: Routed, a: EpisodeStep, clock) -> Corrected:
        with clock("train_s"):
            return self._correct_episodes(st, r, a.episodes, a.exchanged, a.static)

    def update(self, st: RunState, r: Routed, a: EpisodeStep, c: Corrected, clock) -> Updated:
        with clock("train_s"):
            return self._update_episodes(st, r, a.episodes, a.exchanged, c)

    def finish(self, st, s: Sampled, r: Routed, a: EpisodeStep, c: Corrected, u: Updated, clock):
        """The new state, the step's metrics and its anchor pairs (trajectory level, with
        every turn's)."""
        ep, sampled, x, static = a
        metrics = step_metrics(sampled, r, x, c, u, self.spec.uses_wm, clock.seconds, rho=r.rho)
        metrics.update(self._turn_metrics(r, ep, x))
        wall = float(distributed.allgather_host(np.float64(clock.elapsed())).max())
        n_rows, n_real = len(sampled.scripts), len(r.anchor_idx) * self.K
        new_state = dataclasses.replace(
            st, step=st.step + 1, policy=u.policy, wm=u.wm,
            correction=c.result.correction, replay=u.replay,
            wall_time_s=st.wall_time_s + wall, real_executions=st.real_executions + n_real,
            wm_calls=st.wm_calls + (n_rows * self.K if self.spec.uses_wm else 0),
            adaptive_rho=self._next_rule_state(st, c),
        )  # fmt: skip
        metrics["real_executions_step"] = n_real
        metrics["wall_time_s"] = new_state.wall_time_s
        metrics["real_executions"] = new_state.real_executions
        return new_state, metrics, self._pairs(ep, x, c, static)

    def _episode_batch(self, st, tasks, ep: Episodes, routed: Routed):
        """The step's training rows (K turns x N episodes, turn-major) with the reference
        log-probs, and the trajectory-level exchange record."""
        N = len(ep.scripts[0])
        rows = {k: np.concatenate([r[k] for r in ep.rows], axis=0) for k in ep.rows[0]}
        ref_logp = self.logprobs(  # stays on device, into the policy step
            st.ref_params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"])
        )
        r_env, status, _ = best_of_turns(ep.reward, ep.status)
        anchor = routed.anchor_rows
        r_env = np.where(anchor, r_env, 0.0).astype(np.float32)
        status = np.where(anchor, status, UNGRADED).astype(np.int32)
        row_tasks = [t for t in tasks for _ in range(self.G)]
        sampled = Sampled(st.step, row_tasks, rows, ep.scripts[-1])
        x = Exchanged(
            rows=rows, ref_logp=ref_logp, r_wm=ep.r_wm.max(axis=0), r_env=r_env, status=status,
            origin=[(st.step, i) for i in range(N)], trained_tasks=row_tasks,
            collected=len(routed.anchor_idx), new_executions=ep.new_executions,
            pending=self.no_pending,
        )  # fmt: skip
        return sampled, x

    def _static(self, ep: Episodes, routed: Routed) -> np.ndarray:
        """[K, N] per-turn static verdicts (`step.static_outcomes`), -1 where only execution
        tells (all -1 with the static check off)."""
        K, N = ep.status.shape
        if not self.static_check:
            return np.full((K, N), -1, np.int32)
        return np.stack([
            static_outcomes(ep.scripts[t], routed.anchor_idx, ep.status[t], self.static_names)
            for t in range(K)
        ])  # fmt: skip

    def _correct_episodes(
        self, st, routed: Routed, ep: Episodes, x: Exchanged, static_t: np.ndarray
    ) -> Corrected:
        """The single-turn correction on trajectories: raw WM reward = max over the turns the
        static check does not fix (`static_t`, `_static`); an episode whose every turn it
        fixes is fixed, at its best fixed reward."""
        fixed = static_t >= 0
        fixed_reward = np.vectorize(_ladder, otypes=[float])(static_t)
        all_fixed = fixed.all(axis=0)
        best_fixed = np.argmax(fixed_reward, axis=0)
        cols = np.arange(static_t.shape[1])
        static = np.where(all_fixed, static_t[best_fixed, cols], -1).astype(np.int32)
        r_wm = np.where(fixed, -np.inf, ep.r_wm).max(axis=0)
        r_wm = np.where(all_fixed, ep.r_wm.max(axis=0), r_wm).astype(np.float32)
        x_r_wm = r_wm
        env_valid = routed.anchor_rows & (x.status != UNGRADED)
        static_reward = np.array([_ladder(v) if v >= 0 else 0.0 for v in static], np.float32)
        inputs = StepInputs(
            r_wm=x_r_wm, r_env=x.r_env, env_valid=env_valid, anchor_groups=routed.is_anchor,
            anchor_index=self._anchor_index(routed), static_mask=static >= 0,
            static_reward=static_reward, permute_key=self._permute_key(st),
        )  # fmt: skip
        result = self._correct(st.correction, jax.tree.map(jnp.asarray, inputs))
        return Corrected(result, static, env_valid)

    def _update_episodes(self, st, routed: Routed, ep: Episodes, x: Exchanged, c: Corrected):
        """The policy step on every turn's row (the episode's advantage on each) and the WM's
        online step on every real turn of the anchor episodes."""
        rows = x.rows
        adv = jnp.tile(c.result.advantages.astype(jnp.float32), self.K)  # on device
        policy, pmetrics = self._policy_update(st, x, adv)
        wm, replay = st.wm, st.replay
        if self.spec.uses_wm:
            N = len(ep.scripts[0])
            real = (np.arange(self.K)[:, None] * N + routed.anchor_idx[None, :]).reshape(-1)
            flat = lambda a: a.reshape(-1)[real]
            # The observation targets of the real turns (the runtime where the script ran).
            runtime = rldata.executed_runtime(flat(ep.status), flat(ep.obs_arrays["runtime_s"]))
            replay = replay.add(
                {k: rows[k][real] for k in ("tokens", "input_mask")}, flat(ep.reward),
                flat(ep.status), runtime=runtime, error_type=flat(ep.obs_arrays["error_type"]),
                validation=flat(ep.obs_arrays["validation"]),
            )  # fmt: skip
            wm = self._wm_online(wm, replay, st.step)
        jax.block_until_ready((policy, wm))
        return Updated(policy, wm, replay, pmetrics)

    def _turn_metrics(self, routed: Routed, ep: Episodes, x: Exchanged) -> dict:
        idx = routed.anchor_idx
        graded = x.status[idx] != UNGRADED
        tokens = ep.rows[0]["loss_mask"].shape[0] * self.K
        return {
            "turns": self.K,
            "mean_script_tokens": float(x.rows["loss_mask"].sum() / tokens),
            "anchor_reward_by_turn": reward_by_turn(ep.reward[:, idx], graded),
            "anchor_improved_fraction": improved_fraction(ep.reward[:, idx], graded),
            "wm_reward_by_turn": [float(v) for v in ep.r_wm.mean(axis=1)]
            if self.spec.uses_wm else None,
        }  # fmt: skip

    def _pairs(self, ep: Episodes, x: Exchanged, c: Corrected, static: np.ndarray) -> list[dict]:
        """pairs.jsonl: the trajectory pairs (single-turn fields) plus every turn's: its real
        status and reward, the WM's reward, whether the static check decided it
        (`turn_static`) and, where the WM has a runtime head, its P(timeout) under the turn's
        limit (`turn_p_timeout`: a trajectory has no P(timeout) of its own, each turn does)."""
        pairs = anchor_pairs(x, c)
        _, _, best = best_of_turns(ep.reward, ep.status)
        for p in pairs:
            i = p["row"]
            p.update(
                turn_status=[int(v) for v in ep.status[:, i]],
                turn_r_env=[float(v) for v in ep.reward[:, i]],
                turn_r_wm=[float(v) for v in ep.r_wm[:, i]],
                turn_static=[bool(v >= 0) for v in static[:, i]],
                best_turn=int(best[i]) + 1,
            )
            if np.isfinite(ep.p_timeout[:, i]).all():
                p["turn_p_timeout"] = [float(v) for v in ep.p_timeout[:, i]]
        return pairs

    # -- warm-up (compile) ---------------------------------------------------------------

    def warmup(self, st: RunState) -> float:
        """Compile every jitted function of a multi-turn step (both generation shapes, the
        K*N-row log-probs and policy step, the WM's online step) before the RL clock; no
        script is executed and the run's state, journal and pool are untouched."""
        t0 = time.monotonic()
        clock, key = PhaseClock(), jax.random.key(0)
        sampled = self.sample(st, key, clock)
        routed = self.route(st, sampled, key, clock)
        ep = self.rollout(st, sampled, routed, key, clock, execute=False)
        tasks = sampled.row_tasks[:: self.G]
        _, x = self._episode_batch(st, tasks, ep, routed)
        corrected = self._correct_episodes(st, routed, ep, x, self._static(ep, routed))
        copy = lambda tree: jax.tree.map(jnp.copy, tree)
        warm = dataclasses.replace(st, policy=copy(st.policy), wm=copy(st.wm))
        updated = self._update_episodes(warm, routed, ep, x, corrected)
        if self.spec.uses_wm and self.tc.wm_online_steps:  # the WM's step with one real row
            replay = warm.replay.add(
                {k: v[:1] for k, v in x.rows.items() if k in ("tokens", "input_mask")},
                np.zeros(1, np.float32), np.full(1, int(Status.VALID), np.int32),
            )  # fmt: skip
            self._wm_online(updated.wm, replay, st.step)  # (warm.wm may be donated by now)
        # The evaluation's generation shapes (T*k rows) compile on first use, outside the clock.
        return time.monotonic() - t0

    # -- evaluation ----------------------------------------------------------------------

    def evaluate(self, st: RunState) -> dict:
        """k episodes per held-out task, every turn executed for real: the held-out reward is
        the best-of-K mean, `heldout_reward_by_turn` the best of the first t turns, and
        `heldout_improved_fraction` the fraction of episodes whose later turns beat turn 1."""
        t0 = time.monotonic()
        tasks, k, K = self.prepared.heldout_tasks, self.tc.eval_samples, self.K
        key = evaluation.eval_key(self.tc.seed, st.step)
        n = len(tasks) * k
        row_tasks = [t for t in tasks for _ in range(k)]
        past = [[] for _ in range(n)]
        status, reward = np.full((K, n), UNGRADED, np.int32), np.zeros((K, n))
        tokens = 0.0
        for t in range(K):
            rows, scripts = self._turn(
                st.policy.params, t, tasks, row_tasks, past, self.eval_sc, key
            )
            tokens += float(rows["loss_mask"].sum())
            ex = self._submit_turns(
                self.eval_journal, st.step, t * n + np.arange(n), row_tasks, scripts, "eval"
            )
            got, _ = self._collect_turns(self.eval_journal, ex)
            status[t], reward[t] = got["status"], np.nan_to_num(got["reward"])
            for i, o in enumerate(observations_from_arrays(got)):
                past[i].append((scripts[i], o))
        best_r, best_s, _ = best_of_turns(reward, status)
        graded = best_s != UNGRADED
        best_r = np.where(graded, best_r.astype(np.float64), np.nan)
        return {
            "step": st.step,
            "wall_time_s": st.wall_time_s,
            "real_executions": st.real_executions,
            **evaluation.heldout_summary(tasks, k, best_s, best_r),
            "heldout_reward_by_turn": reward_by_turn(reward, graded),
            "heldout_improved_fraction": improved_fraction(reward, graded),
            "heldout_turn1_status_rates": evaluation.heldout_summary(
                tasks, k, status[0], np.where(status[0] != UNGRADED, reward[0], np.nan)
            )["heldout_status_rates"],
            "eval_s": time.monotonic() - t0,
            "mean_script_tokens": tokens / (n * K),
        }


def _ladder(status: int) -> float:
    """The reward of a status fixed without execution (MALFORMED, RUNTIME_ERROR)."""
    return float(status_reward(Status(int(status)))) if status >= 0 else -1.0
