"""The RL loop: generate, route, score with the WM while anchors execute, correct, update.

One step (DESIGN.md section 3), for B training tasks x G scripts:

1. **Generate** G scripts per task with the jitted sampler (tokens + policy log-probs).
2. **Route** whole groups to real execution: `real` executes every group; the other modes
   pick `rho` of the groups (at least `min_groups`), uniformly or partly by WM variance.
3. **Score**: the anchor scripts go to the sandbox pool first, then, while they execute,
   the WM scores every trajectory and the reference policy's log-probs are computed.
4. **Debias** (monotone map fitted on anchor pairs) and **denoise** (anchor weight from the
   WM-vs-real disagreement on anchor groups), as the mode says. Diagnostics use the map as
   it was *before* this step's pairs (out of sample).
5. **GRPO**: anchor groups use real rewards, WM groups calibrated WM scores; ungraded
   trajectories are masked; the anchor weight scales the anchor groups' advantages.
6. **WM online**: the anchor outcomes (real rewards only) join a replay buffer the WM is
   fine-tuned on.

Everything a resumed run needs is in the checkpoint (`checkpoint.py`); every real anchor
outcome is also journalled to `anchors.jsonl` the moment it completes, so a step cut short
by preemption reuses the executions it already paid for instead of losing them.

Several JAX processes (hosts) run the same loop on the same global batch; every jitted
output is gathered (`wmrl.distributed.process_allgather_to_numpy`) before Python reads it.
Host-side work is split: the anchor rows of a step (and the held-out scripts of an
evaluation) are dealt round-robin over the processes, each executes its share on its own
sandbox pool and journals it in its own `anchors.p{index}.jsonl`, and the outcomes are
all-gathered so every process builds the same reward arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import Counter
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from wmrl import distributed
from wmrl.core import debias as debias_lib
from wmrl.core import denoise as denoise_lib
from wmrl.core.grpo import apply_anchor_weight, group_advantages
from wmrl.core.routing import num_anchor_groups, route_anchors
from wmrl.core.state import CorrectionState, init_correction_state
from wmrl.envs.autoresearch.grader import Status, static_outcome
from wmrl.envs.autoresearch.grader import reward as status_reward
from wmrl.models.sampler import SamplingConfig, generate
from wmrl.models.train_steps import TrainState, make_logprobs_fn, make_wm_score_fn
from wmrl.models.world_model import spearman
from wmrl.rl import config as rlconfig
from wmrl.rl import data as rldata
from wmrl.rl import models
from wmrl.rl.anchors import AnchorQueue, open_journal
from wmrl.rl.state import TOKEN_ARRAYS, Pending, Replay, RunState


def correct_rewards(
    correction: CorrectionState,
    r_wm: jax.Array,
    r_env: jax.Array,
    env_valid: jax.Array,
    anchor_rows: jax.Array,
    anchor_groups: jax.Array,
    anchor_index: jax.Array,
    static_mask: jax.Array | None = None,
    static_reward: jax.Array | None = None,
    *,
    group_size: int,
    spec: rlconfig.ModeSpec,
    debias_cfg: debias_lib.DebiasConfig,
    denoise_cfg: denoise_lib.DenoiseConfig,
    normalize_std: bool,
    baseline: str,
):
    """Rewards, advantages and the new correction state for one step (jitted per config).

    Returns `(new correction state, {"rewards", "valid", "advantages", "calibrated"} [N],
    scalar stats)`.

    r_wm: [N] raw WM scores (zeros in `real` mode); r_env: [N] real rewards (valid where
    `env_valid`); anchor_rows: [N] bool; anchor_groups: [B] bool; anchor_index: [A] indices of
    the anchor groups (static count A). static_mask / static_reward: [N] rows whose outcome
    the environment fixes without executing them (`rl.static_check`: a script that does not
    compile is MALFORMED) and that reward; they take it instead of a WM score, and their
    anchor pairs stay out of the monotone map (it calibrates the WM on what it scores).
    """
    G = group_size
    calibrated = (
        debias_lib.apply_debias(correction.debias, r_wm, None, debias_cfg) if spec.debias else r_wm
    )
    if static_mask is None:
        static_mask = jnp.zeros_like(anchor_rows)
        static_reward = jnp.zeros_like(r_wm)
    stream = jnp.where(static_mask, static_reward, calibrated)  # the WM stream's reward
    rewards = jnp.where(anchor_rows, r_env, stream)
    valid = jnp.where(anchor_rows, env_valid, True)
    # Anchor-group views [A, G] for the diagnostics and the stream-level statistics.
    take = lambda x: x.reshape(-1, G)[anchor_index]
    a_raw, a_cal, a_env, a_ok = take(r_wm), take(stream), take(r_env), take(env_valid)
    a_learned = ~take(static_mask)  # the anchor rows the WM stream would have scored
    full = a_ok.all(axis=1)  # groups with every trajectory graded
    diag = debias_lib.bias_diagnostic(
        jnp.where(full[:, None], a_raw, 0.0).reshape(-1),
        jnp.where(full[:, None], a_cal, 0.0).reshape(-1),
        jnp.where(full[:, None], a_env, 0.0).reshape(-1),
        G,
    )
    ok = a_ok.reshape(-1)
    rank = spearman(jnp.where(ok, a_raw.reshape(-1), 0.0), jnp.where(ok, a_env.reshape(-1), 0.0))
    deb, den = correction.debias, correction.denoise
    if spec.debias:
        deb = debias_lib.update_debias(
            deb, a_raw.reshape(-1), a_env.reshape(-1), None, ok & a_learned.reshape(-1), debias_cfg
        )
    if spec.denoise:
        den = denoise_lib.update_denoise(den, a_cal, a_env, denoise_cfg, group_mask=full)
    weight = denoise_lib.anchor_weight(den, denoise_cfg) if spec.denoise else jnp.float32(1.0)
    adv = group_advantages(rewards, G, valid=valid, normalize_std=normalize_std, baseline=baseline)
    adv = apply_anchor_weight(adv, G, anchor_groups, weight)
    stats = {
        "bias_reduction": diag["bias_reduction"],
        "residual_before": diag["residual_before"],
        "residual_after": diag["residual_after"],
        "wm_rank_corr": rank,
        "anchor_weight": weight,
        "calibrated": correction.debias.monotone.fitted if spec.debias else jnp.bool_(False),
        "train_reward": jnp.sum(jnp.where(valid, rewards, 0.0)) / jnp.maximum(valid.sum(), 1),
    }
    out = {"rewards": rewards, "valid": valid, "advantages": adv, "calibrated": calibrated}
    return CorrectionState(debias=deb, denoise=den), out, stats


class Trainer:
    """Holds the jitted functions, the pool and the data; `run_step`/`evaluate` do the work."""

    def __init__(
        self,
        config,
        prepared: rldata.Prepared,
        policy: models.Model,
        wm: models.Model,
        pool,
        workdir: Path,
    ):
        self.config = config
        self.prepared = prepared
        self.tok = prepared.tokenizer
        self.pool = pool
        self.spec = rlconfig.MODE_SPECS[config.mode]
        self.routing = rlconfig.routing_config(config)
        self.debias_cfg = rlconfig.debias_config(config)
        self.denoise_cfg = rlconfig.denoise_config(config)
        self.B, self.G = rlconfig.groups_per_step(config), config.rl.group_size
        self.P, self.N = config.data.max_prompt_len, config.data.max_new_tokens
        self.policy, self.wm = policy, wm
        self.key = jax.random.key(config.seed)
        self.sc = SamplingConfig(
            max_new_tokens=self.N, eos_id=self.tok.eos_id, pad_id=self.tok.pad_id,
            num_samples=self.G, temperature=config.rl.temperature,
        )  # fmt: skip
        self.eval_sc = dataclasses.replace(self.sc, num_samples=config.rl.eval_samples)
        self.max_len = models.seq_len(config)
        # Rows are [prompt: P columns, left-padded | completion]: log-probs from column P on.
        self.logprobs = make_logprobs_fn(policy.graphdef, policy.shardings, policy.mesh, self.P)
        self.wm_score = make_wm_score_fn(wm.graphdef, wm.shardings, wm.mesh)
        self.train = self.prepared.train_tasks
        tasks = self.train + prepared.heldout_tasks
        self.prompts = {t.id: rldata.task_prompt(config, t) for t in tasks}
        self._policy_step = None
        self._wm_step = None
        self.journal = open_journal(workdir)
        # Anchor rows one step behind (rl.anchor_lag): only where a WM stream scores the
        # rest; `real` executes every group and stays synchronous GRPO.
        self.lag = int(config.rl.get("anchor_lag", 0)) if self.spec.uses_wm else 0
        self.anchors = AnchorQueue(self.journal, pool, self.lag)
        # Outcomes known without execution (`rl.static_check`): a script that does not compile
        # gets MALFORMED's exact reward ("compile"), one that reads a name it never defines
        # also RUNTIME_ERROR's ("names"), instead of a WM score.
        level = config.rl.get("static_check", "off") if self.spec.uses_wm else "off"
        self.static_check = level != "off"
        self.static_names = level == "names"
        self.num_anchor_rows = int(num_anchor_groups(self.B, self.B, self.routing)) * self.G
        self.no_pending = Pending.empty(max(self.num_anchor_rows, 1), self.max_len)
        self._correct = jax.jit(
            functools.partial(
                correct_rewards, group_size=self.G, spec=self.spec, debias_cfg=self.debias_cfg,
                denoise_cfg=self.denoise_cfg, normalize_std=config.rl.normalize_std,
                baseline=config.rl.baseline,
            )
        )  # fmt: skip

    # -- pieces --------------------------------------------------------------------------

    def initial_state(self, policy_params, wm_params) -> RunState:
        self.policy = dataclasses.replace(self.policy, tx=models.adam(self.config.rl.learning_rate))
        self.wm = dataclasses.replace(self.wm, tx=models.adam(self.config.wm.online_learning_rate))
        ref = jax.tree.map(jnp.copy, policy_params)
        return RunState(
            policy=self.policy.new_state(policy_params, self.policy.tx),
            ref_params=ref,
            wm=self.wm.new_state(wm_params, self.wm.tx),
            correction=init_correction_state(self.debias_cfg),
            replay=Replay.empty(self.config.wm.replay_size, self.max_len),
            pending=self.no_pending,
            rng=np.asarray(jax.random.key_data(self.key)),
        )

    def warmup(self, st: RunState) -> float:
        """Compile every jitted function of an RL step before the RL clock starts; returns
        the seconds it took.

        XLA compilation is a one-time cost that does not depend on the mode, so `wall_time_s`
        (and with it time-to-target and the speedup ratio) counts steady-state RL only and the
        compile time is reported on its own (`compile_s`). Each function runs once on inputs
        of the step's exact shapes; outputs are discarded and donated states are copies, so
        the run's state, RNG streams, journal and pool are untouched.
        """
        t0 = time.monotonic()
        B, G = self.B, self.G
        rows, _ = self._generate(
            st.policy.params, self._tasks_for_step(st.step), self.sc, jax.random.key(0)
        )
        tokens, mask = jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"])
        if self.spec.uses_wm:
            self._wm_scores(st.wm.params, rows)
        ref_logp = self.logprobs(st.ref_params, tokens, mask)
        ref_logp = distributed.process_allgather_to_numpy(ref_logp)
        group_var = jnp.zeros(B) if self.routing.uncertainty_share > 0 else None
        is_anchor, _ = route_anchors(jax.random.key(0), B, self.routing, None, group_var)
        is_anchor = np.asarray(is_anchor)
        anchor_rows = np.repeat(is_anchor, G)
        zeros = jnp.zeros(B * G, jnp.float32)
        _, out, _ = self._correct(
            st.correction, zeros, zeros, jnp.zeros(B * G, bool), jnp.asarray(anchor_rows),
            jnp.asarray(is_anchor), jnp.asarray(np.nonzero(is_anchor)[0]),
            jnp.zeros(B * G, bool), zeros,
        )  # fmt: skip
        batch = {**rows, "ref_logp": ref_logp, "advantages": np.asarray(out["advantages"])}
        if self._policy_step is None:
            self._policy_step = models.policy_step(self.policy, batch, self.config)
        copy = lambda tree: jax.tree.map(jnp.copy, tree)
        outs = [self._policy_step(copy(st.policy), batch)]
        if self.spec.uses_wm and self.config.wm.online_steps > 0:
            rng = np.random.default_rng(0)
            empty = Replay.empty(self.config.wm.batch_size, self.max_len).arrays()
            b = models.wm_batch(
                empty, np.arange(self.config.wm.batch_size), rng, self.config.wm.num_members
            )
            if self._wm_step is None:
                self._wm_step = models.wm_step(self.wm, b)
            outs.append(self._wm_step(copy(st.wm), b))
        jax.block_until_ready(outs)
        return time.monotonic() - t0

    def _tasks_for_step(self, step: int) -> list:
        """The data iterator: B training tasks for `step`, a pure function of (seed, step)."""
        rng = np.random.default_rng([self.config.seed, step])
        n = len(self.train)
        idx = rng.permutation(n)[: self.B] if n >= self.B else rng.integers(0, n, self.B)
        return [self.train[i] for i in idx]

    def _generate(self, params, tasks, sc, key):
        ids, mask = rldata.encode_prompts(self.tok, [self.prompts[t.id] for t in tasks], self.P)
        out = generate(
            self.policy.graphdef, params, jnp.asarray(ids), jnp.asarray(mask), key, sc, self.max_len
        )
        comp, cmask, logp = distributed.process_allgather_to_numpy(
            (out.tokens, out.mask, out.logprobs)
        )
        G = sc.num_samples
        rows = {
            "tokens": np.concatenate([np.repeat(ids, G, axis=0), comp], axis=1),
            "input_mask": np.concatenate([np.repeat(mask, G, axis=0), cmask], axis=1),
            "loss_mask": np.concatenate(
                [np.zeros((len(comp), self.P), np.float32), cmask.astype(np.float32)], axis=1
            ),
            "old_logp": np.concatenate(
                [np.zeros((len(comp), self.P), np.float32), logp * cmask], axis=1
            ),
        }
        return rows, self._decode(comp, cmask)

    def _decode(self, comp: np.ndarray, cmask: np.ndarray) -> list[str]:
        """The scripts of completions `[n, N]` (tokens where `cmask`)."""
        return [self.tok.decode(row[m.astype(bool)]) for row, m in zip(comp, cmask, strict=True)]

    def _wm_scores(self, params, rows) -> dict:
        out = self.wm_score(params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"]))
        return distributed.process_allgather_to_numpy(dict(out))

    # -- one RL step ---------------------------------------------------------------------

    def run_step(self, st: RunState) -> tuple[RunState, dict, list[dict]]:
        """One RL step; returns the new state, the step's metrics and its anchor pairs.

        With `rl.anchor_lag = 1` (modes with a WM stream) the step's anchor rows execute in
        the background and the step trains on the previous step's anchor rows in their place
        (same group positions, so every shape and the correction maths are unchanged): their
        real outcomes, generation-time log-probs and WM scores. The first step has none and
        masks those positions out.
        """
        cfg, B, G, step = self.config, self.B, self.G, st.step
        t_step = time.monotonic()
        key = jax.random.fold_in(self.key, step)
        k_gen, k_route = jax.random.split(key)
        tasks = self._tasks_for_step(step)
        row_tasks = [t for t in tasks for _ in range(G)]
        t0 = time.monotonic()
        rows, scripts = self._generate(st.policy.params, tasks, self.sc, k_gen)
        generate_s = time.monotonic() - t0

        wm_s = 0.0
        wm_out = None
        if self.spec.uses_wm and self.routing.uncertainty_share > 0:
            t0 = time.monotonic()
            wm_out = self._wm_scores(st.wm.params, rows)
            wm_s += time.monotonic() - t0
            group_var = jnp.asarray(wm_out["predictive_var"].reshape(B, G).mean(axis=1))
        else:
            group_var = None
        is_anchor, picked_by = route_anchors(k_route, B, self.routing, None, group_var)
        is_anchor = np.asarray(is_anchor)
        anchor_rows = np.repeat(is_anchor, G)
        anchor_idx = np.nonzero(anchor_rows)[0]
        a_tasks = [row_tasks[i] for i in anchor_idx]
        a_scripts = [scripts[i] for i in anchor_idx]
        t_exec = time.monotonic()
        submission = self.anchors.submit(step, anchor_idx, a_tasks, a_scripts)
        # While the anchors execute: WM scores and the reference policy's log-probs.
        if self.spec.uses_wm and wm_out is None:
            t0 = time.monotonic()
            wm_out = self._wm_scores(st.wm.params, rows)
            wm_s += time.monotonic() - t0
        t0 = time.monotonic()
        ref_logp = distributed.process_allgather_to_numpy(
            self.logprobs(
                st.ref_params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"])
            )
        )
        train_s = time.monotonic() - t0
        r_wm = wm_out["score"] if wm_out is not None else np.zeros(B * G, np.float32)

        # The anchor outcomes this step trains on, in the anchor positions: this step's own
        # (anchor_lag 0) or the previous step's (anchor_lag 1).
        r_env = np.zeros(B * G, np.float32)
        status = np.full(B * G, int(Status.UNGRADED), np.int32)
        origin = [(step, i) for i in range(B * G)]  # (step, row) each position trains on
        trained_tasks = list(row_tasks)
        new_pending, n_collected, new_execs = self.no_pending, len(anchor_idx), 0
        lagged = bool(self.lag and len(anchor_idx))
        if lagged:
            new_pending = Pending(
                step=np.int64(step), rows=anchor_idx.astype(np.int64),
                ref_logp=ref_logp[anchor_idx], r_wm=np.asarray(r_wm, np.float32)[anchor_idx],
                **{k: rows[k][anchor_idx] for k in TOKEN_ARRAYS},
            )  # fmt: skip
        prev = st.pending
        t0 = time.monotonic()
        got = self.anchors.exchange(submission, prev, self._describe)
        if got is None:  # nothing executed yet: these positions train on nothing
            rows["loss_mask"][anchor_idx] = 0.0
            n_collected = 0
        else:
            r_env[anchor_idx], status[anchor_idx], new_execs = got.r_env, got.status, got.new
        if got is not None and got.step != step:  # the previous step's rows, spliced in
            for k in TOKEN_ARRAYS:
                rows[k][anchor_idx] = getattr(prev, k)
            ref_logp = np.array(ref_logp)  # a writable copy
            ref_logp[anchor_idx] = prev.ref_logp
            r_wm = np.array(r_wm, np.float32)
            r_wm[anchor_idx] = prev.r_wm
            for i, row, task in zip(
                anchor_idx, prev.rows, self._tasks_for_rows(got.step, prev.rows), strict=True
            ):
                origin[i], trained_tasks[i] = (got.step, int(row)), task
        execute_s = time.monotonic() - t_exec
        anchor_wait_s = time.monotonic() - t0 if lagged else execute_s

        t0 = time.monotonic()
        env_valid = anchor_rows & (status != int(Status.UNGRADED))
        static = self._static_outcomes(scripts, rows, anchor_idx, status)
        static_reward = np.array([status_reward(x) if x >= 0 else 0.0 for x in static], np.float32)
        correction, out, stats = self._correct(
            st.correction, jnp.asarray(r_wm), jnp.asarray(r_env), jnp.asarray(env_valid),
            jnp.asarray(anchor_rows), jnp.asarray(is_anchor), jnp.asarray(np.nonzero(is_anchor)[0]),
            jnp.asarray(static >= 0), jnp.asarray(static_reward),
        )  # fmt: skip
        batch = {
            **rows,
            "ref_logp": ref_logp * rows["loss_mask"],
            "advantages": np.asarray(out["advantages"]),
        }
        if self._policy_step is None:
            self._policy_step = models.policy_step(self.policy, batch, cfg)
        policy, pmetrics = self._policy_step(st.policy, batch)
        pmetrics = distributed.process_allgather_to_numpy(pmetrics)
        wm = st.wm
        replay = st.replay
        if self.spec.uses_wm:  # the WM learns only from real outcomes
            replay = replay.add(
                {k: rows[k][anchor_idx] for k in ("tokens", "input_mask")},
                r_env[anchor_idx],
                status[anchor_idx],
            )
            wm = self._wm_online(wm, replay, step)
        jax.block_until_ready((policy, wm))
        train_s += time.monotonic() - t0

        n_anchor = len(anchor_idx)
        counts = Counter(Status(int(s)).name for s in status[anchor_idx] if n_collected)
        metrics = {
            "step": step + 1,
            "generate_s": generate_s,
            "execute_s": execute_s,
            "anchor_wait_s": anchor_wait_s,
            "wm_score_s": wm_s,
            "train_s": train_s,
            "anchor_fraction": n_anchor / (B * G),
            "anchor_groups_uncertainty": int((np.asarray(picked_by) == 2).sum()),
            # Executions submitted this step (with anchor_lag they finish during the next).
            "real_executions_step": n_anchor,
            "anchor_outcomes_from_step": (origin[anchor_idx[0]][0] + 1) if n_collected else None,
            "reused_from_journal": n_collected - new_execs,
            "mean_script_tokens": float(rows["loss_mask"].sum() / (B * G)),
            "anchor_status": dict(counts),
            "static_malformed": int((static[~anchor_rows] == int(Status.MALFORMED)).sum()),
            "static_runtime_error": int((static[~anchor_rows] == int(Status.RUNTIME_ERROR)).sum()),
            "policy_kl": _mean(pmetrics, "kl"),
            **{k: float(v) if v.dtype != bool else bool(v) for k, v in stats.items()},
        }
        if self.spec.uses_wm:
            metrics["wm_anchor_mae"] = (
                float(np.abs(r_wm - r_env)[env_valid].mean()) if env_valid.any() else None
            )
        # The slowest process's step time, so every process stops at the same step when a
        # wall-clock budget runs out.
        wall = float(distributed.allgather_host(np.float64(time.monotonic() - t_step)).max())
        new_state = dataclasses.replace(
            st, step=step + 1, policy=policy, wm=wm, correction=correction, replay=replay,
            wall_time_s=st.wall_time_s + wall, real_executions=st.real_executions + n_anchor,
            wm_calls=st.wm_calls + (B * G if self.spec.uses_wm else 0), pending=new_pending,
        )  # fmt: skip
        metrics["wall_time_s"] = new_state.wall_time_s
        metrics["real_executions"] = new_state.real_executions
        anchor_diagnostics = ("bias_reduction", "residual_before", "residual_after", "wm_rank_corr")
        if not self.spec.uses_wm or not n_collected:  # no WM, or no anchor outcome this step
            for k in anchor_diagnostics:
                metrics[k] = None
        cal = np.asarray(out["calibrated"])
        pairs = [
            {"step": origin[i][0] + 1, "row": origin[i][1], "task_id": trained_tasks[i].id,
             "status": int(status[i]), "r_wm": float(r_wm[i]), "r_cal": float(cal[i]),
             "r_env": float(r_env[i]), "static": bool(static[i] >= 0),
             "static_status": Status(int(static[i])).name if static[i] >= 0 else None}
            for i in np.nonzero(env_valid)[0]
        ]  # fmt: skip
        return new_state, metrics, pairs

    def _static_outcomes(self, scripts, rows, anchor_idx, status) -> np.ndarray:
        """[N] int: the status each row's script gets without executing it
        (`grader.static_outcome`, `rl.static_check`, modes with a WM stream), -1 where only
        execution can tell (every row when the check is off). WM rows: MALFORMED when the
        sandbox pool's own pre-execution check fails ("compile"), RUNTIME_ERROR when the script
        reads a name it never defines ("names"). Anchor rows (with `anchor_lag` the previous
        step's scripts, decoded from the rows trained on) get the same verdict, except that
        MALFORMED is the pool's own (their real status); it only keeps their pairs out of the
        monotone map and is recorded with each pair, so its precision can be measured."""
        static = np.full(len(scripts), -1, np.int32)
        if not self.static_check:
            return static
        anchor_rows = np.zeros(len(scripts), bool)
        anchor_rows[anchor_idx] = True
        P = self.P
        trained = list(scripts)
        for i, text in zip(
            anchor_idx,
            self._decode(rows["tokens"][anchor_idx, P:], rows["input_mask"][anchor_idx, P:]),
            strict=True,
        ):
            trained[i] = text
        for i, text in enumerate(trained):
            got = static_outcome(text.encode("utf-8", "surrogatepass"), names=self.static_names)
            static[i] = -1 if got is None else int(got[0])
        malformed = int(Status.MALFORMED)
        static[anchor_idx] = np.where(
            status[anchor_idx] == malformed,
            malformed,
            np.where(static[anchor_idx] == malformed, -1, static[anchor_idx]),
        )
        return static

    def _tasks_for_rows(self, step: int, rows) -> list:
        """The task of each of the given rows of step `step`'s batch (G rows per task)."""
        tasks = self._tasks_for_step(step)
        return [tasks[int(r) // self.G] for r in rows]

    def _describe(self, pending: Pending) -> tuple[list, list[str]]:
        """(tasks, scripts) of the pending rows, to resubmit them after a restart."""
        tasks = self._tasks_for_rows(int(pending.step), pending.rows)
        return tasks, self._decode(pending.tokens[:, self.P :], pending.input_mask[:, self.P :])

    def drain(self, st: RunState) -> tuple[RunState, float]:
        """Wait for the anchors still executing (`rl.anchor_lag = 1`, `AnchorQueue.drain`);
        the wait counts as training wall-clock. Returns the new state and the seconds."""
        wait = self.anchors.drain(st.pending)
        return dataclasses.replace(st, wall_time_s=st.wall_time_s + wait), wait

    def _wm_online(self, wm: TrainState, replay: Replay, step: int) -> TrainState:
        cfg = self.config
        if replay.count == 0 or cfg.wm.online_steps == 0:
            return wm
        rng = np.random.default_rng([cfg.seed, step, 7])
        arrays = replay.arrays()
        for _ in range(cfg.wm.online_steps):
            idx = rng.integers(0, int(replay.count), cfg.wm.batch_size)
            b = models.wm_batch(arrays, idx, rng, cfg.wm.num_members)
            if self._wm_step is None:
                self._wm_step = models.wm_step(self.wm, b)
            wm, _ = self._wm_step(wm, b)
        return wm

    # -- evaluation ----------------------------------------------------------------------

    def evaluate(self, st: RunState) -> dict:
        """k scripts per held-out task, executed for real; mean reward and status rates.

        The scripts are dealt round-robin over the processes, each runs its share on its own
        pool, and the outcomes are merged so every process returns the same result.
        """
        t0 = time.monotonic()
        tasks = self.prepared.heldout_tasks
        k = self.config.rl.eval_samples
        key = jax.random.fold_in(jax.random.key(self.config.seed + 1), st.step)
        rows, scripts = self._generate(st.policy.params, tasks, self.eval_sc, key)
        row_tasks = [t for t in tasks for _ in range(k)]
        owner = distributed.round_robin_owners(len(scripts))
        mine = np.nonzero(owner == jax.process_index())[0]
        futs = {i: self.pool.submit(row_tasks[i], scripts[i]) for i in mine}
        status = np.full(len(scripts), int(Status.UNGRADED), np.int32)
        reward = np.full(len(scripts), np.nan)  # float64: exactly the grader's rewards
        for i, fut in futs.items():
            res = fut.result()
            status[i], reward[i] = int(res.status), res.reward
        merged = distributed.merge_from_owners({"status": status, "reward": reward}, owner)
        status, reward = merged["status"], merged["reward"]
        graded = status != int(Status.UNGRADED)
        counts = Counter(Status(int(s)).name for s in status[graded])
        per_task = {}
        for i, t in enumerate(tasks):
            rs = reward[i * k : (i + 1) * k][graded[i * k : (i + 1) * k]]
            per_task[t.id] = float(np.mean(rs)) if len(rs) else None
        return {
            "step": st.step,
            "wall_time_s": st.wall_time_s,
            "real_executions": st.real_executions,
            "heldout_reward": float(np.mean(reward[graded])) if graded.any() else None,
            # Its standard error over the scripts (sampling noise of the evaluation itself).
            "heldout_reward_se": (
                float(np.std(reward[graded], ddof=1) / np.sqrt(graded.sum()))
                if graded.sum() > 1
                else None
            ),
            "heldout_status_rates": {
                s.name: counts.get(s.name, 0) / max(int(graded.sum()), 1)
                for s in Status
                if s != Status.UNGRADED
            },
            "heldout_per_task": per_task,
            "heldout_ungraded": int((~graded).sum()),
            "eval_s": time.monotonic() - t0,
            "mean_script_tokens": float(rows["loss_mask"].sum() / len(scripts)),
        }


def _mean(metrics: dict, name: str):
    if name not in metrics:
        return None
    s, c = metrics[name]
    return float(s) / max(float(c), 1.0)
