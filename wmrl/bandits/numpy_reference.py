"""A plain numpy loop over the same bandit work, seed by seed and step by step.

Written independently of the JAX code path (own PAV, own windows, own EMA), it is both the
speed baseline of `wmrl.benchmarks.bandits` and an independent check of the JAX suite's
results in the tests.
"""

from __future__ import annotations

import collections
import math

import ml_collections
import numpy as np

from wmrl.bandits.config import anchor_rho
from wmrl.bandits.train import VARIANT_SPECS
from wmrl.core.denoise import DenoiseConfig


def pav(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted pool-adjacent-violators with the classic stack of blocks."""
    blocks: list[list[float]] = []
    for yi, wi in zip(y, w, strict=True):
        blocks.append([yi, wi, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([[v] * int(n) for v, _, n in blocks])


class _MonotoneMap:
    def __init__(self, cfg):
        self.cfg = cfg
        self.pairs: collections.deque = collections.deque(maxlen=cfg.capacity)
        self.since_fit, self.xs, self.ys = 0, None, None

    def update(self, wm, env):
        self.pairs.extend(zip(wm, env, strict=True))
        self.since_fit += len(wm)
        if len(self.pairs) >= self.cfg.min_pairs and (
            self.xs is None or self.since_fit >= self.cfg.refit_every
        ):
            fit = monotone_fit(np.asarray(self.pairs), self.cfg)
            if fit is not None:
                self.xs, self.ys = fit
                self.since_fit = 0

    def __call__(self, r):
        return r if self.xs is None else monotone_apply(r, self.xs, self.ys, self.cfg)


def monotone_fit(pairs: np.ndarray, cfg) -> tuple[np.ndarray, np.ndarray] | None:
    """The paper's binned isotonic fit: per filled bin the mean WM score and the PAV value of
    the mean real reward; None (stay as before) with fewer than two filled bins."""
    x, y = pairs[:, 0], pairs[:, 1]
    nb = cfg.num_bins
    if cfg.bin_spacing == "equal_mass":
        order = np.sort(x)
        edges = [order[min(k * len(x) // nb, len(x) - 1)] for k in range(1, nb)]
        idx = np.searchsorted(np.asarray(edges), x, side="right")
    else:
        lo, hi = cfg.reward_range
        idx = np.clip(np.floor((x - lo) / (hi - lo) * nb).astype(int), 0, nb - 1)
    xs, ys, ws = [], [], []
    for b in range(nb):
        m = idx == b
        if m.any():
            xs.append(x[m].mean())
            ys.append(y[m].mean())
            ws.append(m.sum())
    if len(xs) < 2:
        return None
    return np.asarray(xs), pav(np.asarray(ys), np.asarray(ws, float))


def monotone_apply(r, xs: np.ndarray, ys: np.ndarray, cfg):
    """Interpolate between the fitted points (constant beyond them), blended with the identity."""
    return (1 - cfg.min_slope) * np.interp(r, xs, ys) + cfg.min_slope * np.asarray(r)


def run_numpy_variant(
    config: ml_collections.ConfigDict, variant: str, num_seeds: int, num_steps: int, seed: int = 0
) -> dict[str, np.ndarray]:
    """Final suboptimality and pi(a*) per seed, and the total number of pulls simulated."""
    if config.bandit.contextual:
        raise ValueError("config.bandit.contextual: the numpy reference covers the K-armed case")
    spec = VARIANT_SPECS[variant]
    b, dcfg, ncfg = config.bandit, config.debias, config.denoise
    r_true = np.asarray(b.true_rewards)
    bias_arm = np.asarray(b.wm_bias)
    noise = np.asarray(b.wm_noise)
    scales = np.asarray(b.head_scales)
    K, B, G = len(r_true), b.batch_size, b.group_size
    ng = B // G
    n_anchor = min(max(math.floor(anchor_rho(b)[0] * ng + 0.5), 1), ng)
    decay = 0.5 ** (1 / ncfg.half_life)
    finals, pistars = [], []
    for s in range(num_seeds):
        rng = np.random.default_rng(seed + s)
        logits = np.zeros(K)
        windows = [collections.deque(maxlen=dcfg.window) for _ in range(K)]
        mono = _MonotoneMap(dcfg)
        ema = norm = scale = 0.0
        n_groups, frozen = 0, False
        for _ in range(num_steps):
            pi = np.exp(logits - logits.max())
            pi /= pi.sum()
            arms = rng.choice(K, size=B, p=pi)
            real = r_true[arms] + b.real_noise * rng.normal(size=B)
            rewards = real
            anchor = np.zeros(ng, bool)
            if spec.reward == "wm":
                bias = np.full(B, b.constant_bias) if spec.constant_bias else bias_arm[arms]
                sd = noise[arms][None, :] * scales[:, None]
                heads = r_true[arms] + bias + sd * rng.normal(size=sd.shape)
                if spec.fuse:
                    prec = 1 / np.maximum(sd, 1e-6) ** 2
                    score, var = (heads * prec).sum(0) / prec.sum(0), 1 / prec.sum(0)
                else:
                    score, var = heads.mean(0), (sd**2).sum(0) / len(scales) ** 2
                cal = score.copy()
                if spec.debias == "keyed":
                    for k in range(K):
                        if len(windows[k]) >= dcfg.min_count:
                            cal[arms == k] -= np.mean(windows[k])
                elif spec.debias == "monotone":
                    cal = mono(score)
                if spec.anchors:
                    anchor[rng.choice(ng, n_anchor, replace=False)] = True
                pull_anchor = np.repeat(anchor, G)
                rewards = np.where(pull_anchor, real, cal)
                if spec.cross_iv:
                    prec = (1 / np.where(pull_anchor, 1.0, var)).reshape(ng, G)
                    w = (prec / prec.mean(1, keepdims=True)).reshape(B)
                    rewards = rewards * np.where(pull_anchor, 1.0, w)
            rg = rewards.reshape(ng, G)
            adv = (rg - rg.mean(1, keepdims=True)) / (rg.std(1, keepdims=True) + 1e-6)
            adv[rg.max(1) == rg.min(1)] = 0.0  # an all-equal group carries no signal
            if spec.anchors:
                idx = np.flatnonzero(pull_anchor)
                if spec.debias == "keyed":
                    for i in idx:
                        windows[arms[i]].append(score[i] - real[i])
                elif spec.debias == "monotone":
                    mono.update(score[idx], real[idx])
                for g in np.flatnonzero(anchor):
                    sc = real.reshape(ng, G)[g] - real.reshape(ng, G)[g].mean()
                    if np.mean(sc**2) <= 1e-8:
                        continue
                    dc = cal.reshape(ng, G)[g] - cal.reshape(ng, G)[g].mean()
                    x = np.mean((dc - sc) ** 2) / np.mean(sc**2)
                    ema, norm = decay * ema + (1 - decay) * x, decay * norm + (1 - decay)
                    n_groups += 1
                    if (
                        not frozen
                        and n_groups >= ncfg.warmup_groups
                        and ema / norm > DenoiseConfig.freeze_floor
                    ):
                        scale = (ncfg.target - 1) / (ema / norm)
                        frozen = True
            # The anchor weight as the disagreement stands after this step's anchor groups
            # (`wmrl.core.correct.correct` reads it after the update, too).
            weight = min(max(1 + scale * (ema / norm if norm else 0.0), 1.0), ncfg.w_max)
            if spec.anchor_weight and frozen:
                adv[anchor] *= weight
            adv = adv.reshape(B)
            onehot = np.eye(K)[arms]
            logits = logits + config.learning_rate * ((onehot - pi) * adv[:, None]).mean(0)
        pi = np.exp(logits - logits.max())
        pi /= pi.sum()
        finals.append(r_true.max() - pi @ r_true)
        pistars.append(pi[np.argmax(r_true)])
    return {
        "final_suboptimality": np.asarray(finals),
        "final_pi_star": np.asarray(pistars),
        "pulls": num_seeds * num_steps * B,
    }
