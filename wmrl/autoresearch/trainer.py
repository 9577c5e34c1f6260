"""The RL loop: generate, route, score with the WM while anchors execute, correct, update.

One step (docs/method.md 3), for B training tasks x G scripts:

1. **Generate** G scripts per task with the jitted sampler (tokens + policy log-probs).
2. **Route** whole groups to real execution: `real` executes every group; the other modes
   pick `rho` of the groups (at least `min_groups`), uniformly or partly by WM variance;
   with `correction.adaptive_rho` the rho in force follows the WM stream's within-group
   agreement measured on the anchors (`wmrl.core.fidelity`, docs/method.md 3.10).
3. **Score**: the anchor scripts go to the sandbox pool first, then, while they execute,
   the WM scores every trajectory and the reference policy's log-probs are computed.
4. **Debias** (monotone map fitted on anchor pairs) and **denoise** (anchor weight from the
   WM-vs-real disagreement on anchor groups), as the mode says. Diagnostics use the map as
   it was *before* this step's pairs (out of sample).
5. **GRPO**: anchor groups use real rewards, WM groups calibrated WM scores; ungraded
   trajectories are masked; the anchor weight scales the anchor groups' advantages.
6. **WM online**: the anchor outcomes (real rewards only) join a replay buffer the WM is
   fine-tuned on (with `wm.kind = "features"` the script-feature scorer is refitted on it
   instead, `wmrl.autoresearch.feature_wm`; with `"verdict"` the policy's backbone stays
   frozen or, fine-tuned, learns the verdicts of those outcomes, `verdict_wm`).

`run_step` is the shared driver `wmrl.experiment.step.run_step` over this class's phases
(`sample`, `route`, `act`, `correct`, `update`, `finish`), each a method with a typed record
in and out (`wmrl.autoresearch.step`), timed by one `PhaseClock`; `warmup` compiles by
calling the same phases. The correction maths is `wmrl.core.correct`, the anchor stream
`wmrl.autoresearch.anchors`, the state `wmrl.autoresearch.state`.

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
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from wmrl import distributed
from wmrl.autoresearch import config as rlconfig
from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import evaluation, model_setup
from wmrl.autoresearch.anchors import AnchorQueue, Submission, open_journal
from wmrl.autoresearch.cost_routing import CostRouting, pending_with_cut_fields
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.grader import reward as status_reward
from wmrl.autoresearch.state import TOKEN_ARRAYS, Pending, Replay, RunState
from wmrl.autoresearch.step import (
    Corrected,
    Exchanged,
    Routed,
    Sampled,
    Scored,
    Updated,
    anchor_pairs,
    corpus_mean_reward,
    no_exchange,
    static_outcomes,
    step_metrics,
)  # fmt: skip
from wmrl.core import fidelity
from wmrl.core.correct import StepInputs, correct_rewards, permutation_key
from wmrl.core.routing import num_anchor_groups, route_anchors
from wmrl.core.state import init_correction_state
from wmrl.experiment.step import PhaseClock, StepKeys, run_step
from wmrl.models.train_steps import TrainState, make_logprobs_fn, make_wm_score_fn

# The step's timings in metrics.jsonl (execute_s spans submission to collection, overlapping
# the WM scoring and reference log-probs computed meanwhile).
STEP_TIMES = ("generate_s", "execute_s", "anchor_wait_s", "wm_score_s", "train_s")


class Trainer:
    """Holds the jitted functions, the pool and the data; `run_step`/`evaluate` do the work."""

    def __init__(
        self,
        config,
        prepared: rldata.Prepared,
        policy: model_setup.Model,
        wm: model_setup.Model,
        pool,
        workdir: Path,
        feature_wm=None,
    ):
        self.config = config  # for the model and data helpers; the step reads `self.tc`
        # wm.kind = "features": the script-feature scorer (`wmrl.autoresearch.feature_wm`)
        # scores the rows and is refitted on the replay of real outcomes; "verdict": the
        # policy's frozen backbone (`wmrl.autoresearch.verdict_wm`), the same interface. The
        # neural WM is then neither called nor trained.
        if (config.wm.kind != "neural") != (feature_wm is not None):
            raise ValueError(
                f"wm.kind={config.wm.kind!r} needs "
                + ("a host scorer (feature_wm=)" if feature_wm is None else "feature_wm=None")
            )
        self.feature_wm = feature_wm
        self.tc = tc = rlconfig.trainer_config(config)
        self.prepared = prepared
        self.tok = prepared.tokenizer
        self.pool = pool
        self.spec, self.routing = tc.spec, tc.routing
        self.B, self.G, self.P, self.N = tc.groups, tc.group_size, tc.prompt_len, tc.new_tokens
        self.policy, self.wm = policy, wm
        self.key = jax.random.key(tc.seed)
        self.sc = evaluation.rl_sampling(config, self.tok, self.G)
        self.eval_sc = dataclasses.replace(self.sc, num_samples=tc.eval_samples)
        self.max_len = model_setup.seq_len(config)
        # Rows are [prompt: P columns, left-padded | completion]: log-probs from column P on.
        self.logprobs = make_logprobs_fn(policy.graphdef, policy.shardings, policy.mesh, self.P)
        self.wm_score = make_wm_score_fn(wm.graphdef, wm.shardings, wm.mesh, fuse=tc.fuse)
        self.train = self.prepared.train_tasks
        tasks = self.train + prepared.heldout_tasks
        self.prompts = {t.id: rldata.task_prompt(config, t) for t in tasks}
        self._policy_step = None
        self._wm_step = None
        self.journal = open_journal(workdir)
        # Held-out executions too: a resumed run does not re-execute (re-randomise) them.
        self.eval_journal = open_journal(workdir, "heldout")
        # Anchor rows one step behind (rl.anchor_lag): only where a WM stream scores the
        # rest; `real` executes every group and stays synchronous GRPO.
        self.anchors = AnchorQueue(self.journal, pool, tc.anchor_lag)
        # Cost-aware routing (`routing = cost`): every other row runs for real under a cap
        # (`wmrl.autoresearch.cost_routing`), journalled in cheap.jsonl; None without it.
        self.cost = None
        if tc.cheap is not None:
            limit = functools.partial(rldata.time_limit, cap_s=tc.time_limit_cap_s)
            self.cost = CostRouting(tc, pool, open_journal(workdir, "cheap"), self.journal, limit)
        # Outcomes known without execution (`rl.static_check`): a script that does not compile
        # gets MALFORMED's exact reward ("compile"), one that reads a name it never defines
        # also RUNTIME_ERROR's ("names"), instead of a WM score.
        self.static_check = tc.static_check != "off"
        self.static_names = tc.static_check == "names"
        # The fidelity-driven anchor fraction (`correction.adaptive_rho`, None = fixed rho):
        # the count of anchor groups changes between steps, so the pending anchors and the
        # anchor groups of the jitted correction are sized to the most a step can have (at
        # rho_max) and padded: no step compiles anything new.
        self.rule = tc.adaptive_rho
        self.max_anchor_groups = rlconfig.max_anchor_groups(tc)
        self.num_anchor_rows = self.max_anchor_groups * self.G
        self.no_pending = Pending.empty(max(self.num_anchor_rows, 1), self.max_len)
        if self.cost is not None:
            self.no_pending = pending_with_cut_fields(self.no_pending)
        self._correct = jax.jit(
            functools.partial(
                correct_rewards, group_size=self.G, spec=self.spec, debias_cfg=tc.debias,
                denoise_cfg=tc.denoise, normalize_std=tc.normalize_std, baseline=tc.baseline,
                std_eps=tc.std_eps, padded=self.rule is not None,
            )
        )  # fmt: skip
        if self.rule is not None:
            self._rho_update = jax.jit(
                functools.partial(fidelity.update_adaptive_rho, config=self.rule)
            )

    # -- pieces --------------------------------------------------------------------------

    def initial_state(self, policy_params, wm_params) -> RunState:
        self.policy = dataclasses.replace(self.policy, tx=model_setup.adam(self.tc.learning_rate))
        self.wm = dataclasses.replace(self.wm, tx=model_setup.adam(self.tc.wm_learning_rate))
        ref = jax.tree.map(jnp.copy, policy_params)
        st = RunState(
            policy=self.policy.new_state(policy_params, self.policy.tx),
            ref_params=ref,
            wm=self.wm.new_state(wm_params, self.wm.tx),
            correction=init_correction_state(
                self.tc.debias,
                corpus_mean_reward(self.prepared.executions, self.static_check, self.static_names),
            ),
            replay=Replay.empty(self.tc.replay_size, self.max_len),
            pending=self.no_pending,
            rng=np.asarray(jax.random.key_data(self.key)),
            adaptive_rho=None if self.rule is None else fidelity.init_adaptive_rho(),
        )
        return st if self.cost is None else self.cost.initial_state(st, self.prepared.executions)

    def warmup(self, st: RunState) -> float:
        """Compile every jitted function of an RL step before the RL clock starts; returns
        the seconds it took.

        XLA compilation is a one-time cost that does not depend on the mode, so `wall_time_s`
        (and with it time-to-target and the speedup ratio) counts steady-state RL only and the
        compile time is reported on its own (`compile_s`). It runs the step's own phases on
        inputs of the step's exact shapes, without the anchor exchange (host work, nothing to
        compile): outputs are discarded and donated states are copies, so the run's state, RNG
        streams, journal and pool are untouched.
        """
        t0 = time.monotonic()
        clock, key = PhaseClock(), jax.random.key(0)
        sampled = self.sample(st, key, clock)
        routed = self.route(st, sampled, key, clock)
        scored = self._score(st, sampled, routed, clock)
        exchanged = no_exchange(sampled, scored, self.no_pending)
        corrected = self._correct_phase(st, routed, exchanged)
        self._next_rule_state(st, corrected)  # the adaptive rule's update (when on)
        copy = lambda tree: jax.tree.map(jnp.copy, tree)
        # One filled replay row, so that the WM's online step runs (and compiles) too.
        replay = Replay.empty(self.tc.wm_batch_size, self.max_len).replace(count=np.int64(1))
        warm = dataclasses.replace(st, policy=copy(st.policy), wm=copy(st.wm), replay=replay)
        self._update(warm, routed, exchanged, corrected)
        return time.monotonic() - t0

    def _tasks_for_step(self, step: int) -> list:
        """The data iterator: B training tasks for `step`, a pure function of (seed, step)."""
        rng = np.random.default_rng([self.tc.seed, step])
        n = len(self.train)
        idx = rng.permutation(n)[: self.B] if n >= self.B else rng.integers(0, n, self.B)
        return [self.train[i] for i in idx]

    def _generate(self, params, tasks, sc, key):
        prompts = [self.prompts[t.id] for t in tasks]
        return evaluation.generate_rows(
            self.policy.graphdef, params, self.tok, prompts, self.P, sc, key, self.max_len
        )

    def _decode(self, comp: np.ndarray, cmask: np.ndarray) -> list[str]:
        """The scripts of completions `[n, N]` (tokens where `cmask`)."""
        return evaluation.decode_scripts(self.tok, comp, cmask)

    def _wm_predict(self, st: RunState, s: Sampled) -> dict:
        """The WM's outputs for the step's rows: the neural WM's (`_wm_scores`), or the
        feature scorer's, fitted on the corpus and the replay of real outcomes in `st`."""
        if self.feature_wm is None:
            return self._wm_scores(st.wm.params, s.rows, s.row_tasks)
        self.feature_wm.fit_to(st.replay)
        if getattr(self.feature_wm, "trains", False):  # a fine-tuned verdict LM: its state
            self.feature_wm.use(st.wm.params)
        return self.feature_wm.predict(s.scripts, s.row_tasks)

    def _wm_scores(self, params, rows, tasks) -> dict:
        """WM predictions of the rows (`tasks`: each row's task, whose time limit the
        runtime head's P(timeout) is taken under)."""
        limits = np.array([rldata.time_limit(t, self.tc.time_limit_cap_s) for t in tasks])
        out = self.wm_score(
            params, jnp.asarray(rows["tokens"]), jnp.asarray(rows["input_mask"]), limits
        )
        return distributed.process_allgather_to_numpy(dict(out))

    # -- one RL step ---------------------------------------------------------------------

    def run_step(self, st: RunState) -> tuple[RunState, dict, list[dict]]:
        """One RL step (`wmrl.experiment.step.run_step` over the phases below); returns the
        new state, the step's metrics and its anchor pairs.

        With `rl.anchor_lag = 1` (modes with a WM stream) the step's anchor rows execute in
        the background and the step trains on the previous step's anchor rows in their place
        (same group positions, so every shape and the correction maths are unchanged): their
        real outcomes, generation-time log-probs and WM scores. The first step has none and
        masks those positions out.
        """
        return run_step(self, st)

    def clock(self) -> PhaseClock:
        return PhaseClock(STEP_TIMES)

    def keys(self, st: RunState) -> StepKeys:
        """Generation and routing keys: a pure function of the run's seed and the step. `act`
        gets the generation key too (multi-turn: turn t samples with it folded with t)."""
        key = jax.random.fold_in(jax.random.wrap_key_data(st.rng), st.step)
        k_gen, k_route = jax.random.split(key)
        return StepKeys(sample=k_gen, route=k_route, act=k_gen)

    def _permute_key(self, st: RunState):
        """The `permuted_wm` control's draw of this step (`core.correct.permutation_key` of
        the step's key, as `keys` folds it), None in every other mode."""
        if not self.spec.permute:
            return None
        return permutation_key(jax.random.fold_in(jax.random.wrap_key_data(st.rng), st.step))

    def act(self, st: RunState, s: Sampled, r: Routed, key, clock: PhaseClock) -> Exchanged:
        """act: the anchor scripts go to the sandbox, the WM scores every row and the
        reference log-probs are computed while they execute, then the outcomes this step
        trains on are collected (`_exchange`)."""
        with clock("execute_s"):
            capped = self.cost.submit(st, s, r) if self.cost is not None else None
            submission = self._submit(s, r, st)
            scored = self._score(st, s, r, clock)  # while the anchors execute
            exchanged = self._exchange(st, s, r, scored, submission, clock)
            if self.cost is not None:  # the capped rows' outcomes
                exchanged = self.cost.collect(st, s, r, scored, exchanged, capped)
        if not self.anchors.lag or not len(r.submit_idx):
            clock.seconds["anchor_wait_s"] = clock.seconds["execute_s"]
        return exchanged

    def correct(self, st: RunState, r: Routed, x: Exchanged, clock: PhaseClock) -> Corrected:
        with clock("train_s"):
            return self._correct_phase(st, r, x)

    def update(
        self, st: RunState, r: Routed, x: Exchanged, c: Corrected, clock: PhaseClock
    ) -> Updated:
        with clock("train_s"):
            return self._update(st, r, x, c)

    def finish(self, st, s: Sampled, r: Routed, x: Exchanged, c: Corrected, u: Updated, clock):
        """The new state, the step's metrics and its anchor pairs."""
        metrics = step_metrics(s, r, x, c, u, self.spec.uses_wm, clock.seconds, rho=r.rho)
        # The slowest process's step time, so every process stops at the same step when a
        # wall-clock budget runs out.
        wall = float(distributed.allgather_host(np.float64(clock.elapsed())).max())
        n_anchor, n_rows = len(r.submit_idx), len(s.scripts)
        new_state = dataclasses.replace(
            st, step=st.step + 1, policy=u.policy, wm=u.wm, correction=c.result.correction,
            replay=u.replay, pending=x.pending, wall_time_s=st.wall_time_s + wall,
            real_executions=st.real_executions + n_anchor,
            wm_calls=st.wm_calls + (n_rows if self.spec.uses_wm else 0),
            adaptive_rho=self._next_rule_state(st, c),
        )  # fmt: skip
        # Sandbox seconds of the outcomes the step trains on (journal hits included).
        metrics["execution_s"] = float(np.nansum(x.runtime_s[r.anchor_idx])) if x.collected else 0.0
        pairs = anchor_pairs(x, c)
        if self.cost is not None:
            new_state, cost_metrics = self.cost.finish(new_state, x, c, n_rows)
            metrics.update(cost_metrics, execution_s=x.execution_s)
            pairs = self.cost.annotate_pairs(pairs, x, c)
        metrics["wall_time_s"] = new_state.wall_time_s
        metrics["real_executions"] = new_state.real_executions
        return new_state, metrics, pairs

    def sample(self, st: RunState, key, clock: PhaseClock) -> Sampled:
        """sample: G scripts for each of the step's B tasks (a pure function of seed, step)."""
        tasks = self._tasks_for_step(st.step)
        with clock("generate_s"):
            rows, scripts = self._generate(st.policy.params, tasks, self.sc, key)
        return Sampled(st.step, [t for t in tasks for _ in range(self.G)], rows, scripts)

    def route(self, st: RunState, s: Sampled, key, clock: PhaseClock) -> Routed:
        """route: the anchor groups (`wmrl.core.routing`); uncertainty routing scores the WM
        first, for its predictive variance.

        Which groups are anchors is a deterministic function of (seed, step, rho in force):
        the sandbox pool's capacity only decides when they run (the pool queues what it
        cannot start yet), never which they are. Under `correction.adaptive_rho` the rho in
        force comes from the rule's state as the previous step left it, i.e. from anchor
        outcomes already collected: with `rl.anchor_lag = 1` the outcomes of the anchors of
        step t-2 and before, trained on at step t-1 (step t-1's own are still executing).
        """
        B, G = self.B, self.G
        wm_out, group_var = None, None
        if self.spec.uses_wm and self.routing.uncertainty_share > 0:
            with clock("wm_score_s"):
                wm_out = self._wm_predict(st, s)
            group_var = jnp.asarray(wm_out["predictive_var"].reshape(B, G).mean(axis=1))
        rho = self.rho_in_force(st)
        n = int(num_anchor_groups(B, B, self.routing, rho=rho))
        pick = lambda n: route_anchors(key, B, self.routing, None, group_var, num_anchors=n)
        executed, picked_by = pick(n)
        executed = np.asarray(executed)
        # With the lag, this step trains on the previous step's anchors: as many groups as
        # that step executed, put in the first positions of this step's draw in that count
        # (the draw is nested: a subset or superset of this step's anchors). Without the
        # adaptive rule the two counts are equal and the positions are this step's anchors.
        placed = executed
        prev = st.pending.live()
        if self.anchors.lag and prev.valid and len(prev.rows) != n * G:
            placed = np.asarray(pick(len(prev.rows) // G)[0])
        anchor_rows = np.repeat(placed, G)
        submit_idx = np.nonzero(np.repeat(executed, G))[0]
        return Routed(
            placed, picked_by, anchor_rows, np.nonzero(anchor_rows)[0], wm_out, submit_idx, rho
        )

    def rho_in_force(self, st: RunState) -> float:
        """The target anchor fraction of the step `st` starts: `correction.rho`, or under
        `correction.adaptive_rho` the rule's (`fidelity.adaptive_rho`) on its state."""
        if self.rule is None:
            return self.routing.rho
        return float(fidelity.adaptive_rho(st.adaptive_rho, self.rule))

    def _next_rule_state(self, st: RunState, c: Corrected):
        """The adaptive rule's state with this step's anchor groups folded in: each group's
        within-group agreement of the WM stream with the real rewards (learned rows; a
        collapsed group counts as no agreement; groups that say nothing are skipped)."""
        if self.rule is None:
            return st.adaptive_rho
        return self._rho_update(st.adaptive_rho, c.result.anchor_agreement)

    def _submit(self, s: Sampled, r: Routed, st: RunState | None = None) -> Submission:
        """The anchor scripts go to the sandbox pool (journal hits reused); `real` under
        cost-aware routing runs them under the cap."""
        idx = r.submit_idx
        tasks, scripts = [s.row_tasks[i] for i in idx], [s.scripts[i] for i in idx]
        caps = self.cost.anchor_caps(st, tasks) if self.cost is not None else None
        return self.anchors.submit(s.step, idx, tasks, scripts, cut_s=caps)

    def _score(self, st: RunState, s: Sampled, r: Routed, clock: PhaseClock) -> Scored:
        """score: WM scores of every row and the reference policy's log-probs."""
        wm_out = r.wm_out
        if self.spec.uses_wm and wm_out is None:
            with clock("wm_score_s"):
                wm_out = self._wm_predict(st, s)
        with clock("train_s"):
            tokens, mask = jnp.asarray(s.rows["tokens"]), jnp.asarray(s.rows["input_mask"])
            ref_logp = self.logprobs(st.ref_params, tokens, mask)  # stays on device
        n = len(s.scripts)
        r_wm = wm_out["score"] if wm_out is not None else np.zeros(n, np.float32)
        p_timeout = wm_out.get("p_timeout") if wm_out is not None else None
        return Scored(r_wm, ref_logp, p_timeout, wm_out)

    def _exchange(
        self, st: RunState, s: Sampled, r: Routed, sc: Scored, sub: Submission, clock
    ) -> Exchanged:
        """exchange anchors: collect the outcomes this step trains on (`AnchorQueue.exchange`)
        and, with the lag, splice the previous step's anchor rows into the anchor positions
        and keep this step's as the new `Pending`."""
        idx, prev, ex = r.anchor_idx, st.pending.live(), r.submit_idx
        x = no_exchange(s, sc, self.no_pending)
        if self.anchors.lag and len(ex):
            x = x._replace(pending=Pending(
                step=np.int64(s.step), rows=ex.astype(np.int64),
                ref_logp=distributed.process_allgather_to_numpy(sc.ref_logp[ex]),  # checkpointed
                r_wm=np.asarray(sc.r_wm, np.float32)[ex], p_timeout=x.p_timeout[ex],
                **{k: s.rows[k][ex] for k in TOKEN_ARRAYS},
            ).padded(self.num_anchor_rows))  # fmt: skip
        with clock("anchor_wait_s"):
            got = self.anchors.exchange(sub, prev, self._describe)
        if got is None:  # nothing executed yet: these positions train on nothing
            s.rows["loss_mask"][idx] = 0.0
            return x
        # Rows executing now outside the positions (adaptive rho grew the count under the
        # lag): trained on next step with their real outcomes, not now.
        s.rows["loss_mask"][np.setdiff1d(ex, idx)] = 0.0
        x.r_env[idx], x.status[idx] = got.r_env, got.status
        for k in ("runtime_s", "error_type", "validation"):  # the WM's observation targets
            if getattr(got, k) is not None:
                getattr(x, k)[idx] = getattr(got, k)
        x = x._replace(collected=len(idx), new_executions=got.new)
        if got.step != s.step:  # the previous step's rows, spliced in
            for k in TOKEN_ARRAYS:
                s.rows[k][idx] = getattr(prev, k)
            ref_logp = x.ref_logp.at[idx].set(prev.ref_logp)  # on device
            r_wm, p_timeout = np.array(x.r_wm, np.float32), np.array(x.p_timeout, np.float32)
            r_wm[idx], p_timeout[idx] = prev.r_wm, prev.p_timeout
            x = x._replace(ref_logp=ref_logp, r_wm=r_wm, p_timeout=p_timeout)
            tasks = self._tasks_for_rows(got.step, prev.rows)
            for i, row, task in zip(idx, prev.rows, tasks, strict=True):
                x.origin[i], x.trained_tasks[i] = (got.step, int(row)), task
        return x

    def _correct_phase(self, st: RunState, r: Routed, x: Exchanged) -> Corrected:
        """correct: static verdicts, then the jitted correction (`wmrl.core.correct`)."""
        idx = r.anchor_idx
        env_valid = r.anchor_rows & (x.status != int(Status.UNGRADED))
        static = np.full(len(x.r_wm), -1, np.int32)
        if self.static_check:  # anchor rows: the scripts trained on (with the lag, decoded)
            trained = list(x.scripts)
            P = self.P
            decoded = self._decode(x.rows["tokens"][idx, P:], x.rows["input_mask"][idx, P:])
            for i, text in zip(idx, decoded, strict=True):
                trained[i] = text
            static = static_outcomes(trained, idx, x.status, self.static_names)
        static_reward = np.array([status_reward(v) if v >= 0 else 0.0 for v in static], np.float32)
        inputs = StepInputs(
            r_wm=x.r_wm, r_env=x.r_env, env_valid=env_valid, anchor_groups=r.is_anchor,
            anchor_index=self._anchor_index(r), static_mask=static >= 0,
            static_reward=static_reward, permute_key=self._permute_key(st),
        )  # fmt: skip
        if self.cost is not None:  # the rows run under the cap
            inputs = self.cost.inputs(inputs, x)
        result = self._correct(st.correction, jax.tree.map(jnp.asarray, inputs))
        return Corrected(result, static, env_valid)

    def _anchor_index(self, r: Routed) -> np.ndarray:
        """The anchor groups' indices; under the adaptive rule a static count, padded with B
        (ignored) to the most a step can have, so the correction never compiles again."""
        groups = np.nonzero(r.is_anchor)[0]
        if self.rule is None:
            return groups
        return np.concatenate([groups, np.full(self.max_anchor_groups - len(groups), self.B)])

    def _policy_update(self, st: RunState, x: Exchanged, advantages: jax.Array):
        """The policy's step on the exchanged rows with these per-row advantages (compiled on
        first use; the correction's output, fed to it on device): (new policy state, its
        metrics on every process)."""
        rows = x.rows
        batch = {**rows, "ref_logp": x.ref_logp * rows["loss_mask"], "advantages": advantages}
        if self._policy_step is None:
            self._policy_step = model_setup.policy_step(self.policy, batch, self.config)
        policy, pmetrics = self._policy_step(st.policy, batch)
        return policy, distributed.process_allgather_to_numpy(pmetrics)

    def _update(self, st: RunState, r: Routed, x: Exchanged, c: Corrected) -> Updated:
        """update: the policy step on the batch; the WM's online step on the replay of real
        outcomes (it learns only from those)."""
        rows, idx = x.rows, r.anchor_idx
        policy, pmetrics = self._policy_update(st, x, c.result.advantages)  # on device
        wm, replay = st.wm, st.replay
        if self.spec.uses_wm:
            anchor = {k: rows[k][idx] for k in ("tokens", "input_mask")}
            runtime = rldata.executed_runtime(x.status[idx], x.runtime_s[idx])
            replay = replay.add(
                anchor,
                x.r_env[idx],
                x.status[idx],
                runtime=runtime,
                error_type=x.error_type[idx],
                validation=x.validation[idx],
            )
            if self.feature_wm is None:  # the feature scorer refits on the replay instead
                wm = self._wm_online(wm, replay, st.step)
            elif getattr(self.feature_wm, "trains", False):  # the fine-tuned verdict LM
                wm = self.feature_wm.online(self.wm, wm, replay, st.step)
        jax.block_until_ready((policy, wm))
        return Updated(policy, wm, replay, pmetrics)

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
        tc = self.tc
        if replay.count == 0 or tc.wm_online_steps == 0:
            return wm
        rng = np.random.default_rng([tc.seed, step, 7])
        arrays = replay.arrays()
        for _ in range(tc.wm_online_steps):
            idx = rng.integers(0, int(replay.count), tc.wm_batch_size)
            flags = model_setup.head_batch_flags(tc.wm_head_coefs)
            b = model_setup.wm_batch(arrays, idx, rng, tc.wm_members, **flags)
            if self._wm_step is None:
                self._wm_step = model_setup.wm_step(self.wm, b, **tc.wm_head_coefs)
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
        k = self.tc.eval_samples
        key = evaluation.eval_key(self.tc.seed, st.step)
        rows, scripts = self._generate(st.policy.params, tasks, self.eval_sc, key)
        row_tasks = [t for t in tasks for _ in range(k)]
        out = evaluation.execute_scripts(
            self.pool, self.eval_journal, st.step, row_tasks, scripts, kind="eval"
        )
        return {
            "step": st.step,
            "wall_time_s": st.wall_time_s,
            "real_executions": st.real_executions,
            **evaluation.heldout_summary(tasks, k, out["status"], out["reward"], out),
            "eval_s": time.monotonic() - t0,
            "mean_script_tokens": float(rows["loss_mask"].sum() / len(scripts)),
        }
