"""purejaxrl-style bandit training: `make_train(config, variant) -> train(rngs)`.

One `jax.jit` compiles the whole run of one variant: an outer `lax.scan` over logging chunks,
an inner `lax.scan` over steps, `jax.vmap` over seeds inside the step. Each step follows the
WMRL step of docs/method.md 3 on a softmax (or linear-softmax, contextual) policy:

  sample B pulls in B/G groups -> WM-score every pull (M heads) -> route anchor groups, which
  are also executed for real -> calibrate WM scores (keyed offsets by arm / monotone map) ->
  group advantages (real rewards on anchor groups, calibrated WM rewards elsewhere) ->
  anchor weight on anchor groups -> policy-gradient step -> feed the anchor pairs to the
  estimators.

Variants switch parts of that pipeline on and off (`VariantSpec`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import PartitionSpec as P

from wmrl.bandits.config import anchor_rho
from wmrl.bandits.problem import BanditProblem, make_problem
from wmrl.core import correct, debias, denoise, grpo, routing
from wmrl.core.correct import MODE_SPECS, ModeSpec
from wmrl.core.state import CorrectionState, init_correction_state


@dataclasses.dataclass(frozen=True)
class VariantSpec:
    """What one baseline/ablation turns on."""

    reward: Literal["real", "wm"]
    anchors: bool = False  # anchor groups executed for real, their real rewards used
    debias: debias.DebiasMode = "none"
    fuse: bool = False  # sample-level inverse-variance fusion of the WM heads
    anchor_weight: bool = False  # stream-level anchor weight
    cross_iv: bool = False  # per-sample inverse-variance reward weighting (negative control)
    constant_bias: bool = False  # replace the per-arm WM bias by a global constant


def mode_variant(mode: ModeSpec) -> VariantSpec:
    """A WMRL mode of the shared table (`wmrl.core.correct.MODE_SPECS`) as a bandit variant,
    with the switches it has in every experiment: every WM mode executes its anchor groups
    for real and trains on their real rewards (the mode's corrections are what differ); the
    bandit WM's debiasing is keyed by arm, its sample-level fusion is the mode's `fuse` and
    the anchor weight its `denoise`."""
    if not mode.uses_wm:
        return VariantSpec(reward="real")
    return VariantSpec(
        reward="wm", anchors=True, debias="keyed" if mode.debias else "none", fuse=mode.fuse,
        anchor_weight=mode.denoise,
    )  # fmt: skip


VARIANT_SPECS: dict[str, VariantSpec] = {
    # (the controls `static_anchors` and `permuted_wm` belong to settings with a static check;
    # a bandit has none)
    **{name: mode_variant(m) for name, m in MODE_SPECS.items() if not m.control},
    # ablations and controls of the bandit study
    "debias_monotone_only": VariantSpec(reward="wm", anchors=True, debias="monotone"),
    "constant_bias": VariantSpec(reward="wm", constant_bias=True),
    "cross_arm_iv": VariantSpec(
        reward="wm", anchors=True, debias="keyed", fuse=True, anchor_weight=True, cross_iv=True
    ),
}


# ----------------------------------------------------------------------------- policy


def pick(table: jax.Array, arms: jax.Array) -> jax.Array:
    """`table[..., arms]` per pull as a chain of K selects: arms [N] in [0, K) -> [N].

    table is [K], [N, K], or [1, K] (one row shared by every pull, e.g. the K-armed bandit).

    With a handful of arms this is elementwise work that XLA fuses into its neighbours. A
    gather inside the vmapped, scanned step runs element by element on CPU, and a one-hot
    compare-and-sum is a reduction over a K-wide axis, which XLA CPU hands to a library call
    that costs far more than the arithmetic.
    """
    out = jnp.broadcast_to(table[..., 0], arms.shape)
    for k in range(1, table.shape[-1]):
        out = jnp.where(arms == k, table[..., k], out)
    return out


def init_policy(problem: BanditProblem) -> dict[str, jax.Array]:
    """Uniform softmax policy: logits = b + x @ W."""
    k, d = problem.num_arms, problem.context_dim
    return {"b": jnp.zeros((k,), jnp.float32), "W": jnp.zeros((d, k), jnp.float32)}


def policy_logits(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """[..., K] logits for contexts x [..., d]."""
    return params["b"] + x @ params["W"]


def policy_gradient(params, x: jax.Array, arms: jax.Array, adv: jax.Array):
    """Gradient of the surrogate `mean_i adv_i log pi(a_i | x_i)` (ascent direction).

    x is [N, d], or [1, d] when every pull shares one context.
    """

    def surrogate(p):
        logp = jax.nn.log_softmax(policy_logits(p, x))
        return jnp.mean(adv * pick(logp, arms))

    return jax.grad(surrogate)(params)


# ----------------------------------------------------------------------------- one step


def sample_arms(u: jax.Array, logits: jax.Array) -> jax.Array:
    """Categorical draw by inverse CDF from one uniform per pull (u [N], logits [N or 1, K]).

    Equal in law to `jax.random.categorical` but needs one random number per pull instead of
    K Gumbels, which dominates the cost of a vmapped bandit step on CPU.
    """
    cdf = jnp.cumsum(jax.nn.softmax(logits), axis=-1)[..., :-1]
    return jnp.sum(u[..., None] > cdf, axis=-1).astype(jnp.int32)


def head_log_vars(problem: BanditProblem) -> jax.Array:
    """[M, K] log-variance of every head for every arm (a per-arm constant of the WM)."""
    sd = problem.head_scales[:, None] * problem.wm_noise[None, :]
    return jnp.log(jnp.maximum(sd, 1e-6) ** 2)


def wm_heads_from_noise(problem: BanditProblem, eps: jax.Array, arms, x: jax.Array, bias):
    """Per-head WM means and log-variances [M, N] given standard-normal noise eps [M, N]."""
    r = pick(problem.rewards(x), arms)
    log_vars = jax.vmap(pick, in_axes=(0, None))(head_log_vars(problem), arms)
    return r + bias + jnp.exp(0.5 * log_vars) * eps, log_vars


def wm_heads(problem: BanditProblem, rng: jax.Array, arms: jax.Array, x: jax.Array, bias):
    """Per-head WM means and log-variances [M, N] for pulls `arms` [N] in contexts x [N, d]."""
    eps = jax.random.normal(rng, (problem.num_heads, arms.shape[0]))
    return wm_heads_from_noise(problem, eps, arms, x, bias)


def wm_score(means: jax.Array, log_vars: jax.Array, fuse: bool) -> tuple[jax.Array, jax.Array]:
    """WM score and its variance per pull: inverse-variance fusion or the plain head average."""
    mu, var, _ = denoise.combine_members(means, log_vars, fuse, axis=0)
    return mu, var


def score_variance_per_arm(problem: BanditProblem, fuse: bool) -> jax.Array:
    """[K] variance of the combined WM score of each arm (fused or plain head average)."""
    log_vars = head_log_vars(problem)
    return wm_score(jnp.zeros_like(log_vars), log_vars, fuse)[1]


def wm_score_exact(problem: BanditProblem, eps: jax.Array, arms, x: jax.Array, bias, fuse: bool):
    """Draw the WM score from its exact law, one normal per pull (eps [N]).

    The heads are independent Gaussians whose variances depend only on the arm, so both the
    inverse-variance fusion and the plain average are Gaussian with mean `r + b` and the
    variance that `wm_score` reports. Drawing that directly is equal in law to drawing the M
    heads and combining them (`tests/bandits/test_bandits.py` checks it), with 1 random number per
    pull instead of M: on CPU the threefry draws dominate the vmapped step.
    """
    r = pick(problem.rewards(x), arms)
    var = pick(score_variance_per_arm(problem, fuse), arms)
    return r + bias + jnp.sqrt(var) * eps, var


@dataclasses.dataclass(frozen=True)
class StepStatics:
    """Everything static about one variant's step (hashable config pieces)."""

    spec: VariantSpec
    batch_size: int
    group_size: int
    learning_rate: float
    real_cost: float
    constant_bias: float
    baseline: str
    normalize_std: bool
    wm_sampling: str
    routing: routing.RoutingConfig
    debias: debias.DebiasConfig
    denoise: denoise.DenoiseConfig


def make_step(problem: BanditProblem, st: StepStatics) -> Callable:
    """One WMRL step for one seed: (carry, rng) -> (carry, metrics)."""
    spec, B, G = st.spec, st.batch_size, st.group_size
    num_groups = B // G
    d = problem.context_dim

    M = problem.num_heads
    uses_wm = spec.reward == "wm"
    # "heads" draws every head; "exact" draws the (fused or averaged) score from its exact law.
    wm_draws = (M if st.wm_sampling == "heads" else 1) if uses_wm else 0
    n_anchor_groups = int(routing.num_anchor_groups(num_groups, num_groups, st.routing))

    anchor_pulls = n_anchor_groups * G if spec.anchors else 0
    # Real executions drawn per step: every pull for `real`, only the anchor pulls otherwise.
    real_draws = B if not uses_wm else anchor_pulls

    def step(carry, rng):
        params, corr = carry["params"], carry["corr"]
        k_u, k_eps, k_route = jax.random.split(rng, 3)
        # One uniform per pull for the action and one normal block for contexts, real noise and
        # the WM: few, large RNG calls keep the vmapped step cheap (threefry dominates on CPU).
        u = jax.random.uniform(k_u, (B,))
        eps = jax.random.normal(k_eps, (B * (d + wm_draws) + real_draws,))
        # The K-armed bandit has no context: all pulls share one (empty) context, so the
        # policy, reward and bias tables are [1, K] rather than the same row repeated [B, K]
        # (softmax, cumsum and the gradient's reductions then run once per step, not per pull).
        x = eps[: B * d].reshape(B, d) if d else jnp.zeros((1, 0), eps.dtype)
        real_eps = eps[B * d : B * d + real_draws]
        head_eps = eps[B * d + real_draws :].reshape(wm_draws, B)
        arms = sample_arms(u, policy_logits(params, x))
        r_true = pick(problem.rewards(x), arms)
        if not uses_wm:
            real = r_true + problem.real_noise * real_eps
            adv = grpo.group_advantages(
                real, G, baseline=st.baseline, normalize_std=st.normalize_std
            )
            grad = policy_gradient(params, x, arms, adv)
            params = jax.tree.map(lambda p, g: p + st.learning_rate * g, params, grad)
            metrics = {
                "cost": jnp.asarray(st.real_cost * B, jnp.float32),
                "anchor_weight": jnp.ones(()),
                "bias_reduction": jnp.zeros(()),
            }
            return {"params": params, "corr": corr}, metrics

        if spec.constant_bias:
            bias = jnp.full((B,), st.constant_bias)
        else:
            bias = pick(problem.bias(x), arms)
        if st.wm_sampling == "heads":
            means, log_vars = wm_heads_from_noise(problem, head_eps, arms, x, bias)
            score, var = wm_score(means, log_vars, spec.fuse)
        else:
            score, var = wm_score_exact(problem, head_eps[0], arms, x, bias, spec.fuse)
        metrics = {
            "cost": jnp.asarray(B + st.real_cost * anchor_pulls, jnp.float32),
            "anchor_weight": jnp.ones(()),
            "bias_reduction": jnp.zeros(()),
        }
        is_anchor = jnp.zeros((num_groups,), bool)
        if spec.anchors:
            # Whole groups are executed for real; only they get real rewards (and real noise).
            is_anchor, _ = routing.route_anchors(k_route, num_groups, st.routing)
            groups = jnp.nonzero(is_anchor, size=n_anchor_groups)[0]
            take = lambda v: v.reshape(num_groups, G)[groups]
            real = take(r_true) + problem.real_noise * real_eps.reshape(n_anchor_groups, G)
            c = correct.correct(
                corr, score, real, groups, group_size=G,
                debias_on=spec.debias != "none", denoise_on=True, debias_cfg=st.debias,
                denoise_cfg=st.denoise, keys=arms,
                refit=False,  # `refit_due_maps` in make_train refits outside the vmap
            )  # fmt: skip
            corr, rewards, weight = c.correction, c.rewards, c.weight
            diag = debias.bias_diagnostic(
                take(score).reshape(-1), take(c.calibrated).reshape(-1), real.reshape(-1), G
            )
            metrics["bias_reduction"] = diag["bias_reduction"]
            if spec.anchor_weight:
                metrics["anchor_weight"] = weight
        else:
            rewards = debias.apply_debias(corr.debias, score, arms, st.debias)
        if spec.cross_iv:
            # Negative control: weights *different* pulls by their own inverse variance.
            anchor_pull = jnp.repeat(is_anchor, G)
            w = denoise.cross_sample_weights(jnp.where(anchor_pull, 1.0, var), G)
            rewards = rewards * jnp.where(anchor_pull, 1.0, w)
        adv = grpo.group_advantages(
            rewards, G, baseline=st.baseline, normalize_std=st.normalize_std
        )
        if spec.anchor_weight:
            adv = grpo.apply_anchor_weight(adv, G, is_anchor, weight)
        grad = policy_gradient(params, x, arms, adv)
        params = jax.tree.map(lambda p, g: p + st.learning_rate * g, params, grad)
        return {"params": params, "corr": corr}, metrics

    return step


def refit_due_maps(corr: CorrectionState, config: debias.DebiasConfig) -> CorrectionState:
    """Refit the monotone maps of all seeds (leading axis) that are due, at once.

    The step appends anchor pairs with `refit=False` and this runs right after it, outside the
    vmap over seeds: under `lax.cond` on "any seed due", steps where no seed is due skip the
    fit, which inside the vmap would run for every seed at every step. Every seed gets the
    same number of anchor pairs per step, so all are due together: the fit runs once every
    `refit_every / anchor pulls` steps. Seeds that are not due keep their map (docs/method.md 3.4).
    """
    if not config.uses_monotone:
        return corr
    maps = corr.debias.monotone
    due = jax.vmap(lambda m: debias.monotone_refit_due(m, config))(maps)
    maps = jax.lax.cond(
        due.any(), jax.vmap(lambda m: debias.refit_monotone_map(m, config)), lambda m: m, maps
    )
    return corr.replace(debias=corr.debias.replace(monotone=maps))


def evaluate(problem: BanditProblem, params, eval_x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(suboptimality E_x[max_a r - pi . r], E_x[pi(a* | x)]) on fixed evaluation contexts."""
    r = problem.rewards(eval_x)
    pi = jax.nn.softmax(policy_logits(params, eval_x))
    sub = jnp.mean(r.max(-1) - (pi * r).sum(-1))
    pi_star = jnp.mean(jnp.take_along_axis(pi, r.argmax(-1)[:, None], axis=1))
    return sub, pi_star


# ----------------------------------------------------------------------------- the run


def statics_from_config(config: ml_collections.ConfigDict, variant: str) -> StepStatics:
    b = config.bandit
    spec = VARIANT_SPECS[variant]
    mode = spec.debias
    return StepStatics(
        spec=spec,
        batch_size=b.batch_size,
        group_size=b.group_size,
        learning_rate=config.learning_rate,
        real_cost=b.real_cost,
        constant_bias=b.constant_bias,
        baseline=b.baseline,
        normalize_std=b.normalize_std,
        wm_sampling=b.wm_sampling,
        routing=routing.RoutingConfig(rho=anchor_rho(b)[0], min_groups=1),
        debias=debias.DebiasConfig(
            mode=mode,
            num_keys=len(b.true_rewards),
            offset_rule=config.debias.offset_rule,
            window=config.debias.window,
            half_life=config.debias.half_life,
            min_count=config.debias.min_count,
            capacity=config.debias.capacity,
            num_bins=config.debias.num_bins,
            bin_spacing=config.debias.bin_spacing,
            min_slope=config.debias.min_slope,
            min_pairs=config.debias.min_pairs,
            refit_every=config.debias.refit_every,
            reward_range=tuple(config.debias.reward_range),
        ),
        denoise=denoise.DenoiseConfig(
            half_life=config.denoise.half_life,
            warmup_groups=config.denoise.warmup_groups,
            target=config.denoise.target,
            w_max=config.denoise.w_max,
        ),
    )


def log_schedule(num_steps: int, log_points: int) -> tuple[int, int, int]:
    """(log_every, num_chunks, remainder): num_chunks full chunks of log_every steps, then a
    final partial chunk of `remainder` steps (0 when log_every divides num_steps)."""
    log_every = max(1, math.ceil(num_steps / log_points))
    return log_every, num_steps // log_every, num_steps % log_every


def logged_steps(num_steps: int, log_points: int):
    """The step numbers at which curves are recorded."""
    log_every, num_chunks, remainder = log_schedule(num_steps, log_points)
    steps = [(i + 1) * log_every for i in range(num_chunks)]
    return steps + ([num_steps] if remainder else [])


def output_specs(seed_axis: str) -> dict:
    """PartitionSpecs of `train`'s outputs when seeds are split over mesh axis `seed_axis`:
    seeds are the last axis of every output."""
    seeds, per_chunk = P(seed_axis), P(None, seed_axis)
    return {
        "curves": per_chunk,
        "final_suboptimality": seeds,
        "final_pi_star": seeds,
        "hit_step": seeds,
        "hit_cost": seeds,
    }


def make_train(config: ml_collections.ConfigDict, variant: str) -> Callable:
    """Returns `train(rngs [S]) -> outputs` for one variant, ready for `jax.jit`.

    Outputs (S = seeds, C = logged chunks): `curves` {suboptimality, pi_star, cost,
    anchor_weight, bias_reduction} each [C, S] at the end of every chunk; `final_suboptimality`,
    `final_pi_star`, `hit_step`, `hit_cost` each [S] (hit_* = -1 when never reached).
    """
    problem = make_problem(config)
    st = statics_from_config(config, variant)
    step = make_step(problem, st)
    vstep = jax.vmap(step)
    num_steps = config.num_steps
    log_every, num_chunks, remainder = log_schedule(num_steps, config.log_points)
    threshold = config.threshold
    # The plain K-armed bandit has no context: one (empty) evaluation context is exact.
    num_eval = config.eval_contexts if problem.context_dim else 1
    eval_x = jax.random.normal(
        jax.random.key(config.problem_seed + 1), (num_eval, problem.context_dim)
    )
    veval = jax.vmap(lambda p: evaluate(problem, p, eval_x))

    def train(rngs: jax.Array):
        S = rngs.shape[0]
        corr = init_correction_state(st.debias)
        carry = {
            "params": jax.vmap(lambda _: init_policy(problem))(jnp.arange(S)),
            "corr": jax.vmap(lambda _: corr)(jnp.arange(S)),
            "rng": rngs,
            "t": jnp.zeros((), jnp.int32),
            "cost": jnp.zeros((S,), jnp.float32),
            "hit_step": jnp.full((S,), -1, jnp.int32),
            "hit_cost": jnp.full((S,), -1.0, jnp.float32),
        }

        def one_step(c, _):
            keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(c["rng"], c["t"])
            inner, m = vstep({"params": c["params"], "corr": c["corr"]}, keys)
            inner["corr"] = refit_due_maps(inner["corr"], st.debias)
            cost = c["cost"] + m["cost"]
            sub, _ = veval(inner["params"])
            t1 = c["t"] + 1
            hit_now = (c["hit_step"] < 0) & (sub <= threshold)
            out = {
                "params": inner["params"],
                "corr": inner["corr"],
                "rng": c["rng"],
                "t": t1,
                "cost": cost,
                "hit_step": jnp.where(hit_now, t1, c["hit_step"]),
                "hit_cost": jnp.where(hit_now, cost, c["hit_cost"]),
            }
            return out, (m["anchor_weight"], m["bias_reduction"])

        def chunk(c, length):
            c, (w, red) = jax.lax.scan(one_step, c, None, length=length)
            sub, pi_star = veval(c["params"])
            curves = {
                "suboptimality": sub,
                "pi_star": pi_star,
                "cost": c["cost"],
                "anchor_weight": w[-1],
                "bias_reduction": red.mean(0),
            }
            return c, curves

        carry, curves = jax.lax.scan(lambda c, _: chunk(c, log_every), carry, None, num_chunks)
        if remainder:
            carry, last = chunk(carry, remainder)
            curves = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), curves, last)
        sub, pi_star = veval(carry["params"])
        return {
            "curves": curves,
            "final_suboptimality": sub,
            "final_pi_star": pi_star,
            "hit_step": carry["hit_step"],
            "hit_cost": carry["hit_cost"],
        }

    return train
