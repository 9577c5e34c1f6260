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
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from wmrl.core.denoise import fuse_ensemble
from wmrl.core.stats import interval_ece, spearman
from wmrl.models.config import TransformerConfig
from wmrl.models.transformer import Transformer, causal_padding_mask, positions_from_mask


@dataclasses.dataclass(frozen=True)
class WorldModelConfig:
    """`num_classes=0` drops the class head; `head_hidden=0` means `trunk.d_model`."""

    trunk: TransformerConfig
    num_members: int = 5
    num_classes: int = 0
    head_hidden: int = 0
    min_log_var: float = -10.0
    max_log_var: float = 4.0

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

    def __call__(self, tokens: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
        """`tokens, mask: [B, T]` -> `mean, log_var: [M, B]` (float32), `class_logits: [B, C]`.

        The trunk's final states are mean-pooled over real tokens: invariant to
        padding side and length, and every trajectory token feeds the reward.
        """
        h, _ = self.trunk.hidden(tokens, positions_from_mask(mask), causal_padding_mask(mask))
        w = mask.astype(jnp.float32)[..., None]
        pooled = jnp.sum(h.astype(jnp.float32) * w, axis=1) / jnp.maximum(w.sum(axis=1), 1.0)
        params = [p.get_value().astype(jnp.float32) for p in
                  (self.head_w1, self.head_b1, self.head_w2, self.head_b2)]  # fmt: skip
        mean, raw = jax.vmap(_member, in_axes=(0, 0, 0, 0, None))(*params, pooled)
        lo, hi = self.cfg.min_log_var, self.cfg.max_log_var
        log_var = hi - jax.nn.softplus(hi - raw)  # smooth clamp keeps the NLL finite
        log_var = lo + jax.nn.softplus(log_var - lo)
        out = {"mean": mean, "log_var": log_var}
        if self.class_w is not None:
            out["class_logits"] = pooled @ self.class_w.get_value().astype(jnp.float32)
        return out


def predict(outputs: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Fuse member outputs (`[M, B]`) into the WM score and its variances (`[B]` each)."""
    score, score_var, epistemic = fuse_ensemble(outputs["mean"], outputs["log_var"], axis=0)
    aleatoric = jnp.mean(jnp.exp(outputs["log_var"]), axis=0)
    return {
        "score": score,
        "score_var": score_var,
        "epistemic_var": epistemic,
        "aleatoric_var": aleatoric,
        "predictive_var": aleatoric + epistemic,
    }


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
    return out


def wm_loss(
    outputs: dict, batch: dict, normaliser: dict, class_coef: float = 1.0, rank_coef: float = 0.0
):
    """Bootstrap-weighted Gaussian NLL over members + class cross-entropy (+ with `rank_coef`
    the within-group pairwise ranking loss).

    batch: `target: [B]`, `member_weights: [B, M]`, optional `class_label: [B]`
    (int, -1 = no label), optional `group: [B]` (int task index, -1 = none) and `graded: [B]`
    (bool) for the ranking loss. Returns (loss divided by the global normalisers,
    metrics as (sum, count) pairs).
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
    return loss, metrics


def wm_loss_fn(class_coef: float = 1.0, rank_coef: float = 0.0):
    """Loss function in the `wmrl.models.train_steps.make_train_step` convention."""

    def loss_fn(model: WorldModel, mb: dict, normaliser: dict):
        out = model(mb["tokens"], mb["input_mask"])
        return wm_loss(out, mb, normaliser, class_coef, rank_coef)

    return loss_fn


def calibration_metrics(model: WorldModel, batch: dict) -> dict[str, jax.Array]:
    """Held-out calibration: interval ECE (predictive variance), Spearman of score vs truth."""
    pred = predict(model(batch["tokens"], batch["input_mask"]))
    return {
        "ece": interval_ece(pred["score"], pred["predictive_var"], batch["target"]),
        "spearman": spearman(pred["score"], batch["target"]),
        "rmse": jnp.sqrt(jnp.mean(jnp.square(pred["score"] - batch["target"]))),
        "mean_epistemic_var": jnp.mean(pred["epistemic_var"]),
    }
