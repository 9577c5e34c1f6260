"""World model: a transformer trunk with an ensemble reward head and an outcome-class head.

The WM reads `(task prompt, trajectory)` tokens and predicts the execution
outcome. The reward head is an ensemble of M small MLPs whose parameters are
stacked on a leading `ensemble` axis and applied with `jax.vmap`; each member
outputs a mean and a log-variance. Members share the trunk (one forward pass)
and stay diverse through independent initialisation and per-member bootstrap
weights in the loss. `wmrl.core.denoise.fuse_ensemble` turns the members into
the WM score (inverse-variance fusion) and its variance.

Variances, and which one to use where:
* `score_var` = `1 / sum_m(1 / v_m)`: variance of the fused *score* when members
  are treated as independent estimates; feeds routing and denoising weights.
* `predictive_var` = mean_m(v_m) + Var_m(mu_m): the deep-ensemble mixture
  variance of the *outcome* (aleatoric + epistemic); the calibration metric
  checks intervals built from it, because intervals around a real outcome must
  include the outcome noise that the fused score variance averages away.

Runtime head (`runtime_head=True`): one MLP on the pooled state predicting the mean and
log-variance of the script's log runtime (seconds), a censored Gaussian: a timed-out script's
runtime is only known to exceed what was observed, so its term is `-log P(y > y_obs)` (a Tobit
likelihood). Given the time limit the script will run under, `predict` turns it into
`p_timeout = P(log runtime > log limit)` and the WM score into the expected reward of the
mixture `(1 - p_timeout) * score + p_timeout * timeout_reward`: the reward head is then fitted
on the scripts that did not time out (E[r | the script finishes]), so a script the WM thinks
times out cannot get a high predicted score. The limit is an input (the RL run's cap may be
below the limit the corpus was executed under: a 30 s script that was VALID in the corpus
times out under a 20 s cap).

Observation heads (the multi-turn feedback a WM writes, `wmrl.autoresearch.wm_observation`): the
class
head is the status head (over the ladder's statuses); `num_error_types > 0` adds a linear
error-type head (logits over `observation.ERROR_TYPES`, trained on RUNTIME_ERROR rows only:
P(exception class | runtime error)); `validation_head` an MLP predicting the mean and
log-variance of the raw validation metric (trained where an episode execution measured one).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.scipy.special import log_ndtr, ndtr

from wmrl.core.denoise import combine_members
from wmrl.core.stats import interval_ece, spearman
from wmrl.models.config import TransformerConfig
from wmrl.models.transformer import Transformer, causal_padding_mask, positions_from_mask


@dataclasses.dataclass(frozen=True)
class WorldModelConfig:
    """`num_classes=0` drops the class head; `head_hidden=0` means `trunk.d_model`;
    `runtime_head` adds the censored log-runtime head (its score adjustment gives a timed-out
    script `timeout_reward`)."""

    trunk: TransformerConfig
    num_members: int = 5
    num_classes: int = 0
    head_hidden: int = 0
    min_log_var: float = -10.0
    max_log_var: float = 4.0
    runtime_head: bool = False
    timeout_reward: float = 0.1
    num_error_types: int = 0
    validation_head: bool = False

    def __post_init__(self):
        if self.num_members < 1:
            raise ValueError(f"world model: num_members must be >= 1, got {self.num_members}")
        if self.num_classes < 0:
            raise ValueError(f"world model: num_classes must be >= 0, got {self.num_classes}")
        if not self.min_log_var < self.max_log_var:
            raise ValueError("world model: min_log_var must be < max_log_var")


def _member(w1, b1, w2, b2, x):
    """One ensemble member: `[B, D] -> (mean [B], raw log-variance [B])`."""
    h = jax.nn.gelu(x @ w1 + b1)
    out = h @ w2 + b2
    return out[:, 0], out[:, 1]


class WorldModel(nnx.Module):
    def __init__(self, cfg: WorldModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.trunk = Transformer(cfg.trunk, rngs=rngs)
        M, D = cfg.num_members, cfg.trunk.d_model
        Hh = cfg.head_hidden or D
        pd = cfg.trunk.storage_dtype
        normal = lambda shape, std: jax.random.normal(rngs.params(), shape, pd) * std
        self.head_w1 = nnx.Param(
            normal((M, D, Hh), D**-0.5), logical_axes=("ensemble", "embed", "mlp")
        )
        self.head_b1 = nnx.Param(jnp.zeros((M, Hh), pd), logical_axes=("ensemble", "mlp"))
        self.head_w2 = nnx.Param(
            normal((M, Hh, 2), Hh**-0.5), logical_axes=("ensemble", "mlp", None)
        )
        self.head_b2 = nnx.Param(jnp.zeros((M, 2), pd), logical_axes=("ensemble", None))
        self.class_w = (
            nnx.Param(normal((D, cfg.num_classes), D**-0.5), logical_axes=("embed", "classes"))
            if cfg.num_classes
            else None
        )
        if cfg.runtime_head:  # [D] -> (mean, raw log-variance) of log runtime (s)
            self.runtime_w1 = nnx.Param(normal((D, Hh), D**-0.5), logical_axes=("embed", "mlp"))
            self.runtime_b1 = nnx.Param(jnp.zeros((Hh,), pd), logical_axes=("mlp",))
            self.runtime_w2 = nnx.Param(normal((Hh, 2), Hh**-0.5), logical_axes=("mlp", None))
            self.runtime_b2 = nnx.Param(jnp.zeros((2,), pd), logical_axes=(None,))
        if cfg.num_error_types:
            E = cfg.num_error_types
            self.error_w = nnx.Param(normal((D, E), D**-0.5), logical_axes=("embed", "classes"))
        if cfg.validation_head:  # [D] -> (mean, raw log-variance) of the validation metric
            self.validation_w1 = nnx.Param(normal((D, Hh), D**-0.5), logical_axes=("embed", "mlp"))
            self.validation_b1 = nnx.Param(jnp.zeros((Hh,), pd), logical_axes=("mlp",))
            self.validation_w2 = nnx.Param(normal((Hh, 2), Hh**-0.5), logical_axes=("mlp", None))
            self.validation_b2 = nnx.Param(jnp.zeros((2,), pd), logical_axes=(None,))

    def __call__(self, tokens: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
        """`tokens, mask: [B, T]` -> `mean, log_var: [M, B]` (float32), `class_logits: [B, C]`,
        with the runtime head `runtime_mean, runtime_log_var: [B]` (log seconds), with the
        error-type head `error_logits: [B, E]`, with the validation head `validation_mean,
        validation_log_var: [B]`.

        The trunk's final states are mean-pooled over real tokens: invariant to
        padding side and length, and every trajectory token feeds the reward.
        """
        h, _ = self.trunk.hidden(tokens, positions_from_mask(mask), causal_padding_mask(mask))
        w = mask.astype(jnp.float32)[..., None]
        pooled = jnp.sum(h.astype(jnp.float32) * w, axis=1) / jnp.maximum(w.sum(axis=1), 1.0)
        params = [p.get_value().astype(jnp.float32) for p in
                  (self.head_w1, self.head_b1, self.head_w2, self.head_b2)]  # fmt: skip
        mean, raw = jax.vmap(_member, in_axes=(0, 0, 0, 0, None))(*params, pooled)
        out = {"mean": mean, "log_var": self._clamp(raw)}
        if self.class_w is not None:
            out["class_logits"] = pooled @ self.class_w.get_value().astype(jnp.float32)
        if self.cfg.runtime_head:
            w1, b1, w2, b2 = [p.get_value().astype(jnp.float32) for p in
                              (self.runtime_w1, self.runtime_b1, self.runtime_w2,
                               self.runtime_b2)]  # fmt: skip
            rt_mean, rt_raw = _member(w1, b1, w2, b2, pooled)
            out["runtime_mean"], out["runtime_log_var"] = rt_mean, self._clamp(rt_raw)
        if self.cfg.num_error_types:
            out["error_logits"] = pooled @ self.error_w.get_value().astype(jnp.float32)
        if self.cfg.validation_head:
            w1, b1, w2, b2 = [p.get_value().astype(jnp.float32) for p in
                              (self.validation_w1, self.validation_b1, self.validation_w2,
                               self.validation_b2)]  # fmt: skip
            v_mean, v_raw = _member(w1, b1, w2, b2, pooled)
            out["validation_mean"], out["validation_log_var"] = v_mean, self._clamp(v_raw)
        return out

    def _clamp(self, raw: jax.Array) -> jax.Array:
        """Smooth clamp of a raw log-variance into [min_log_var, max_log_var] (keeps the NLL
        finite)."""
        lo, hi = self.cfg.min_log_var, self.cfg.max_log_var
        log_var = hi - jax.nn.softplus(hi - raw)
        return lo + jax.nn.softplus(log_var - lo)


def timeout_probability(runtime_mean, runtime_log_var, time_limit_s) -> jax.Array:
    """`P(log runtime > log limit)` under the runtime head's Gaussian; 0 for an infinite
    limit (no limit)."""
    z = (jnp.log(time_limit_s) - runtime_mean) * jnp.exp(-0.5 * runtime_log_var)
    return ndtr(-z)


def predict(
    outputs: dict[str, jax.Array],
    time_limit_s: jax.Array | None = None,
    timeout_reward=0.1,
    fuse: bool = True,
) -> dict[str, jax.Array]:
    """Combine member outputs (`[M, B]`) into the WM score and its variances (`[B]` each):
    inverse-variance fusion, or with `fuse` False the members' plain mean
    (`wmrl.core.denoise.combine_members`; the mode's sample-level switch).

    With the runtime head and `time_limit_s` ([B] seconds; inf = no limit) also
    `p_timeout`, `runtime_s` (the predicted median runtime) and `score_raw` (the reward
    head's fused score); `score` is then the mixture `(1 - p) * score_raw + p *
    timeout_reward` (the variances stay the reward head's)."""
    score, score_var, epistemic = combine_members(outputs["mean"], outputs["log_var"], fuse)
    aleatoric = jnp.mean(jnp.exp(outputs["log_var"]), axis=0)
    out = {
        "score": score,
        "score_var": score_var,
        "epistemic_var": epistemic,
        "aleatoric_var": aleatoric,
        "predictive_var": aleatoric + epistemic,
    }
    if "runtime_mean" in outputs:
        out["runtime_s"] = jnp.exp(outputs["runtime_mean"])
        # the log-runtime's variance: P(timeout | ran past a cap) needs it (cost routing)
        out["runtime_log_var"] = outputs["runtime_log_var"]
        if time_limit_s is not None:
            p = timeout_probability(
                outputs["runtime_mean"], outputs["runtime_log_var"], time_limit_s
            )
            out["p_timeout"] = p
            out["score_raw"] = score
            out["score"] = (1.0 - p) * score + p * timeout_reward
    return out


def censored_gaussian_nll(mean, log_var, target, censored) -> jax.Array:
    """Gaussian NLL where `censored` is False; where True, `target` is a lower bound (a
    timed-out run): `-log P(y > target)`."""
    z = (target - mean) * jnp.exp(-0.5 * log_var)
    return jnp.where(censored, -log_ndtr(-z), gaussian_nll(mean, log_var, target))


def gaussian_nll(mean: jax.Array, log_var: jax.Array, target: jax.Array) -> jax.Array:
    """Elementwise `0.5 * (log 2pi + log v + (y - mu)^2 / v)`."""
    return 0.5 * (math.log(2 * math.pi) + log_var + jnp.square(target - mean) * jnp.exp(-log_var))


def bootstrap_weights(rng: jax.Array, batch: int, num_members: int) -> jax.Array:
    """`[B, M]` Poisson(1) weights: the online bootstrap, one resample per member.

    Each member sees each example k ~ Poisson(1) times, so members fit
    different resamples of the data and disagree where data are scarce.
    """
    return jax.random.poisson(rng, 1.0, (batch, num_members)).astype(jnp.float32)


def ranked_pairs(target: jax.Array, group: jax.Array, graded: jax.Array) -> jax.Array:
    """`[B, B]` float mask of the ordered pairs (i, j) of one group with target_i > target_j.

    `group` [B] int: rows of one task (the scripts GRPO compares); -1 = in no group. Ties carry
    no order and no pair."""
    same = (group[:, None] == group[None, :]) & (group[:, None] >= 0)
    ok = graded[:, None] & graded[None, :]
    return (same & ok & (target[:, None] > target[None, :])).astype(jnp.float32)


def pairwise_rank_loss(mean: jax.Array, pairs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Logistic (RankNet) loss `softplus(-(mu_i - mu_j))` of each member's mean [M, B] over
    the ordered pairs [B, B] of `ranked_pairs`; returns (sum over members and pairs, pair
    count x members).

    GRPO sees only differences inside a group, so this is the part of the WM's error that moves
    the policy; the Gaussian NLL alone fits the level of each task's rewards."""
    diff = mean[:, :, None] - mean[:, None, :]  # [M, B, B]
    total = jnp.sum(jax.nn.softplus(-diff) * pairs[None])
    return total, jnp.sum(pairs) * mean.shape[0]


def wm_normalisers(batch: dict) -> dict[str, jax.Array]:
    """Global normalisers (whole batch) so micro-batch accumulation stays exact (the ranking
    loss's pairs are counted over the whole batch: pairs split between micro-batches are not
    formed, which only scales that term down)."""
    labels = batch.get("class_label")
    n_cls = 1.0 if labels is None else jnp.sum((labels >= 0).astype(jnp.float32))
    out = {
        "nll": jnp.maximum(jnp.sum(batch["member_weights"]), 1.0),
        "ce": jnp.maximum(n_cls, 1.0),
    }
    if "group" in batch:
        pairs = ranked_pairs(batch["target"], batch["group"], batch["graded"])
        out["rank"] = jnp.maximum(jnp.sum(pairs) * batch["member_weights"].shape[1], 1.0)
    if "runtime_mask" in batch:
        out["runtime"] = jnp.maximum(jnp.sum(batch["runtime_mask"]), 1.0)
    if "error_type" in batch:
        out["error"] = jnp.maximum(jnp.sum((batch["error_type"] >= 0).astype(jnp.float32)), 1.0)
    if "validation_mask" in batch:
        out["validation"] = jnp.maximum(jnp.sum(batch["validation_mask"]), 1.0)
    return out


def wm_loss(
    outputs: dict, batch: dict, normaliser: dict, class_coef: float = 1.0, rank_coef: float = 0.0,
    runtime_coef: float = 0.0, error_type_coef: float = 0.0, validation_coef: float = 0.0,
):  # fmt: skip
    """Bootstrap-weighted Gaussian NLL over members + class cross-entropy (+ with `rank_coef`
    the within-group pairwise ranking loss, + with `runtime_coef` the runtime head's censored
    NLL).

    batch: `target: [B]`, `member_weights: [B, M]`, optional `class_label: [B]`
    (int, -1 = no label), optional `group: [B]` (int task index, -1 = none) and `graded: [B]`
    (bool) for the ranking loss, optional `log_runtime: [B]` (log seconds), `runtime_mask:
    [B]` (float, 0 = unknown) and `timed_out: [B]` (bool: the runtime is a lower bound) for
    the runtime head; optional `error_type: [B]` (int, -1 = no label) for the error-type
    head's cross-entropy (`error_type_coef`) and `validation: [B]`, `validation_mask: [B]`
    for the validation head's Gaussian NLL (`validation_coef`). Returns (loss divided by the
    global normalisers, metrics as (sum, count) pairs).
    """
    weights = batch["member_weights"].T  # [M, B]
    nll = gaussian_nll(outputs["mean"], outputs["log_var"], batch["target"][None])
    nll_sum = jnp.sum(weights * nll)
    loss = nll_sum / normaliser["nll"]
    fused = predict(outputs)["score"]
    n = jnp.float32(batch["target"].shape[0])
    metrics = {
        "nll": (nll_sum, jnp.sum(weights)),
        "mse": (jnp.sum(jnp.square(fused - batch["target"])), n),
    }
    if "class_logits" in outputs and "class_label" in batch:
        labels = batch["class_label"]
        valid = (labels >= 0).astype(jnp.float32)
        logp = jax.nn.log_softmax(outputs["class_logits"], axis=-1)
        ce = -jnp.take_along_axis(logp, jnp.maximum(labels, 0)[:, None], axis=-1)[:, 0]
        ce_sum = jnp.sum(ce * valid)
        loss = loss + class_coef * ce_sum / normaliser["ce"]
        correct = (jnp.argmax(logp, axis=-1) == labels).astype(jnp.float32) * valid
        metrics["class_ce"] = (ce_sum, jnp.sum(valid))
        metrics["class_acc"] = (jnp.sum(correct), jnp.sum(valid))
    if rank_coef and "group" in batch:
        pairs = ranked_pairs(batch["target"], batch["group"], batch["graded"])
        rank_sum, rank_n = pairwise_rank_loss(outputs["mean"], pairs)
        loss = loss + rank_coef * rank_sum / normaliser["rank"]
        metrics["rank"] = (rank_sum, rank_n)
    if runtime_coef and "runtime_mean" in outputs and "runtime_mask" in batch:
        rmask = batch["runtime_mask"]
        nll_rt = censored_gaussian_nll(
            outputs["runtime_mean"], outputs["runtime_log_var"], batch["log_runtime"],
            batch["timed_out"],
        )  # fmt: skip
        rt_sum = jnp.sum(nll_rt * rmask)
        loss = loss + runtime_coef * rt_sum / normaliser["runtime"]
        metrics["runtime_nll"] = (rt_sum, jnp.sum(rmask))
        done = rmask * (1.0 - batch["timed_out"].astype(jnp.float32))
        err = jnp.abs(outputs["runtime_mean"] - batch["log_runtime"]) * done
        metrics["runtime_log_mae"] = (jnp.sum(err), jnp.sum(done))
    if error_type_coef and "error_logits" in outputs and "error_type" in batch:
        labels = batch["error_type"]
        known = (labels >= 0).astype(jnp.float32)
        logp = jax.nn.log_softmax(outputs["error_logits"], axis=-1)
        ce = -jnp.take_along_axis(logp, jnp.maximum(labels, 0)[:, None], axis=-1)[:, 0]
        ce_sum = jnp.sum(ce * known)
        loss = loss + error_type_coef * ce_sum / normaliser["error"]
        hit = (jnp.argmax(logp, axis=-1) == labels).astype(jnp.float32) * known
        metrics["error_ce"] = (ce_sum, jnp.sum(known))
        metrics["error_acc"] = (jnp.sum(hit), jnp.sum(known))
    if validation_coef and "validation_mean" in outputs and "validation_mask" in batch:
        vmask = batch["validation_mask"]
        nll_v = gaussian_nll(outputs["validation_mean"], outputs["validation_log_var"],
                             batch["validation"])  # fmt: skip
        v_sum = jnp.sum(nll_v * vmask)
        loss = loss + validation_coef * v_sum / normaliser["validation"]
        metrics["validation_nll"] = (v_sum, jnp.sum(vmask))
    return loss, metrics


def wm_loss_fn(
    class_coef: float = 1.0, rank_coef: float = 0.0, runtime_coef: float = 0.0,
    error_type_coef: float = 0.0, validation_coef: float = 0.0,
):  # fmt: skip
    """Loss function in the `wmrl.models.train_steps.make_train_step` convention."""

    def loss_fn(model: WorldModel, mb: dict, normaliser: dict):
        out = model(mb["tokens"], mb["input_mask"])
        return wm_loss(out, mb, normaliser, class_coef, rank_coef, runtime_coef,
                       error_type_coef, validation_coef)  # fmt: skip

    return loss_fn


def calibration_metrics(model: WorldModel, batch: dict) -> dict[str, jax.Array]:
    """Held-out calibration: interval ECE (predictive variance), Spearman of score vs truth."""
    pred = predict(model(batch["tokens"], batch["input_mask"]))
    return {
        "ece": interval_ece(pred["score"], pred["predictive_var"], batch["target"]),
        "spearman": spearman(pred["score"], batch["target"], undefined=0.0),
        "rmse": jnp.sqrt(jnp.mean(jnp.square(pred["score"] - batch["target"]))),
        "mean_epistemic_var": jnp.mean(pred["epistemic_var"]),
    }
