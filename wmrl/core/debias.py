"""Online Debiasing (docs/method.md 3.4): two estimators that do different jobs.

* Keyed offsets `b(z)`: a running mean of `r_wm - r_env` per discrete key z (the arm in a
  bandit, optionally the task or the WM's predicted outcome class), over a window or as an EMA
  with start-up correction. Applied as `r_wm - b(z)` once the key has `min_count` pairs. This is
  what removes bias that *differs between actions* and can flip the argmax. Offsets that are
  constant within a GRPO group (e.g. key = task) cancel under group standardisation: with
  key = task they are a no-op for the policy gradient.
* Monotone map (the paper's): a window of recent (r_wm, r_env) pairs with a FIFO cap, and a
  binned isotonic fit `f: r -> E[r_env | r]` (equal-width or equal-mass bins, weighted
  pool-adjacent-violators on the bins' mean real rewards, linear interpolation between the
  points (mean WM score, isotonic value) of filled bins, blended with the identity so the map
  is strictly increasing). Identity until `min_pairs` pairs and two filled bins, refit every
  `refit_every` new pairs. Strictly increasing, so it never reorders a group and never ties
  two different scores; non-affine, so it survives group standardisation. It corrects scale
  distortions but, being a global monotone map, it keeps the WM's order of actions: it cannot
  undo a bias that reorders them.

When both are on, the keyed offsets are applied first and the map is fitted on the
offset-corrected scores. The whole estimator state is one pytree (`DebiasState`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct

DebiasMode = Literal["none", "keyed", "monotone", "both"]


@dataclasses.dataclass(frozen=True)
class DebiasConfig:
    """Hyper-parameters of the bias estimator (the method's defaults, docs/method.md 3)."""

    mode: DebiasMode = "monotone"
    # keyed offsets
    num_keys: int = 1
    offset_rule: Literal["window", "ema"] = "window"
    window: int = 256  # pairs per key (rule = window)
    half_life: float = 64.0  # pairs per key (rule = ema)
    min_count: int = 8
    # monotone map
    capacity: int = 5000
    num_bins: int = 10
    bin_spacing: Literal["equal_width", "equal_mass"] = "equal_width"
    min_slope: float = 0.05  # weight of the identity in the map's convex blend (strictness)
    min_pairs: int = 200
    refit_every: int = 64
    reward_range: tuple[float, float] = (0.0, 1.0)

    def __post_init__(self):
        def bad(field, msg):
            raise ValueError(f"debias.{field} {msg}")

        if self.mode not in ("none", "keyed", "monotone", "both"):
            bad("mode", f"must be one of none/keyed/monotone/both, got {self.mode!r}")
        if self.offset_rule not in ("window", "ema"):
            bad("offset_rule", f"must be 'window' or 'ema', got {self.offset_rule!r}")
        for name in ("num_keys", "window", "capacity", "num_bins", "refit_every"):
            if getattr(self, name) < 1:
                bad(name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("min_count", "min_pairs"):
            if getattr(self, name) < 0:
                bad(name, f"must be >= 0, got {getattr(self, name)}")
        if self.bin_spacing not in ("equal_width", "equal_mass"):
            bad("bin_spacing", f"must be 'equal_width' or 'equal_mass', got {self.bin_spacing!r}")
        if not 0.0 <= self.min_slope < 1.0:
            bad("min_slope", f"must be in [0, 1), got {self.min_slope}")
        if self.half_life <= 0:
            bad("half_life", f"must be > 0, got {self.half_life}")
        lo, hi = self.reward_range
        if not hi > lo:
            bad("reward_range", f"must satisfy low < high, got {self.reward_range}")

    @property
    def uses_keyed(self) -> bool:
        return self.mode in ("keyed", "both")

    @property
    def uses_monotone(self) -> bool:
        return self.mode in ("monotone", "both")


# ----------------------------------------------------------------------------- keyed offsets


@struct.dataclass
class KeyedOffsetState:
    buffer: jax.Array  # [K, W] recent residuals (window rule) or [K, 1] unused (ema rule)
    position: jax.Array  # [K] next write slot in the ring buffer
    count: jax.Array  # [K] pairs seen per key
    total: jax.Array  # [K] sum of the residuals in each key's window (kept incrementally)
    ema: jax.Array  # [K] un-normalised EMA of the residual
    ema_norm: jax.Array  # [K] EMA of 1 (start-up correction)


def after_reads(write: jax.Array, *reads: jax.Array) -> jax.Array:
    """The write mask `write` [N], unchanged, but data-dependent on `reads` (float arrays [N]).

    The estimators' ring buffers (the keyed windows, the map's pair window) are read, for the
    entries about to be evicted, and then overwritten. Inside a `lax.scan`, XLA updates a
    carried buffer in place only if it can prove that every read of it happens before the
    write, and it learns that only from data dependencies; otherwise it copies the whole
    buffer, twice per step. Nothing else links the write to the reads (the mask is even a
    constant when every pair is valid), and in the bandit suite, thousands of seeds under a
    vmap, those copies cost more than the rest of the estimators' update. `r > inf` is false
    for every float, NaN included, so the mask is unchanged; XLA (jaxlib 0.10) does not fold
    it away. If a later XLA did, only the copies would come back, not a different result
    (`tests/core/test_debias.py` checks that the buffers are updated in place).
    """
    for r in reads:
        write = write & ~(r > jnp.inf)
    return write


def init_keyed_offsets(config: DebiasConfig) -> KeyedOffsetState:
    # Parts the mode does not use get minimal shapes: the state is carried through every
    # step of a scan, so dead buffers would still cost memory traffic.
    k = config.num_keys if config.uses_keyed else 1
    w = config.window if config.offset_rule == "window" and config.uses_keyed else 1
    return KeyedOffsetState(
        buffer=jnp.zeros((k, w), jnp.float32),
        position=jnp.zeros((k,), jnp.int32),
        count=jnp.zeros((k,), jnp.int32),
        total=jnp.zeros((k,), jnp.float32),
        ema=jnp.zeros((k,), jnp.float32),
        ema_norm=jnp.zeros((k,), jnp.float32),
    )


def update_keyed_offsets(
    state: KeyedOffsetState,
    r_wm: jax.Array,
    r_env: jax.Array,
    keys: jax.Array,
    valid: jax.Array,
    config: DebiasConfig,
) -> KeyedOffsetState:
    """Fold a batch of anchor pairs into the per-key running means, in batch order.

    Vectorised (no sequential scan): each valid pair's rank among the earlier valid pairs of its
    key gives its ring-buffer slot and its EMA discount, so the result equals feeding the pairs
    one at a time. O(N K) work for N pairs and K keys.
    """
    decay = math.pow(0.5, 1.0 / config.half_life)
    window = state.buffer.shape[1]
    keys = jnp.clip(keys.astype(jnp.int32), 0, config.num_keys - 1)
    valid = jnp.asarray(valid, bool)
    resid = (r_wm - r_env).astype(jnp.float32)
    onehot = jax.nn.one_hot(keys, config.num_keys, dtype=jnp.int32) * valid[:, None]
    onehot_f = onehot.astype(jnp.float32)  # per-key sums as dense products (no scatter-add)
    n_new = onehot.sum(axis=0)  # [K]
    rank = jnp.take_along_axis(jnp.cumsum(onehot, axis=0) - onehot, keys[:, None], axis=1)[:, 0]
    # Only the last `window` pairs of a key survive this batch; earlier ones would be overwritten.
    write = valid & (rank >= n_new[keys] - window)
    slot = (state.position[keys] + rank) % window
    # A written slot evicts its previous occupant when the key's window was already that full.
    evict = write & (state.count[keys] + rank >= window)
    evicted = state.buffer[keys, slot]
    delta = jnp.where(write, resid, 0.0) - jnp.where(evict, evicted, 0.0)
    row = jnp.where(after_reads(write, evicted), keys, config.num_keys)  # num_keys = dropped
    buffer = state.buffer.at[row, slot].set(resid, mode="drop")
    # EMA: pair i of key k is discounted by decay^(later pairs of k in this batch).
    later = n_new[keys] - rank - 1
    w = jnp.where(valid, (1 - decay) * decay ** later.astype(jnp.float32), 0.0)
    keep = decay ** n_new.astype(jnp.float32)
    return state.replace(
        buffer=buffer,
        position=(state.position + n_new) % window,
        count=state.count + n_new,
        total=state.total + delta @ onehot_f,
        ema=keep * state.ema + (w * resid) @ onehot_f,
        ema_norm=keep * state.ema_norm + w @ onehot_f,
    )


def keyed_offsets(state: KeyedOffsetState, config: DebiasConfig) -> tuple[jax.Array, jax.Array]:
    """Current per-key offsets [K] and whether each key is ready (count >= min_count)."""
    if config.offset_rule == "window":
        offset = state.total / jnp.maximum(jnp.minimum(state.count, state.buffer.shape[1]), 1)
    else:
        offset = state.ema / jnp.maximum(state.ema_norm, 1e-12)
    ready = state.count >= max(config.min_count, 1)
    return jnp.where(ready, offset, 0.0), ready


# ----------------------------------------------------------------------------- monotone map


@struct.dataclass
class MonotoneMapState:
    wm: jax.Array  # [C] pair window (FIFO ring buffer)
    env: jax.Array  # [C]
    position: jax.Array  # next write slot
    size: jax.Array  # pairs currently stored (<= C)
    since_fit: jax.Array  # pairs added since the last fit
    fitted: jax.Array  # bool: map active
    bin_count: jax.Array  # [num_bins] pairs of the window in each equal-width bin (incremental)
    bin_sum: jax.Array  # [num_bins] sum of r_env of those pairs
    bin_wm_sum: jax.Array  # [num_bins] sum of r_wm of those pairs
    bin_x: jax.Array  # [num_bins] mean WM score of each bin's pairs at the last fit
    bin_values: jax.Array  # [num_bins] isotonic bin values at the last fit
    bin_filled: jax.Array  # [num_bins] bool: bin had data at the last fit


def init_monotone_map(config: DebiasConfig) -> MonotoneMapState:
    c = config.capacity if config.uses_monotone else 1
    nb = config.num_bins
    zeros = jnp.zeros((nb,), jnp.float32)
    return MonotoneMapState(
        wm=jnp.zeros((c,), jnp.float32),
        env=jnp.zeros((c,), jnp.float32),
        position=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
        since_fit=jnp.zeros((), jnp.int32),
        fitted=jnp.zeros((), bool),
        bin_count=zeros,
        bin_sum=zeros,
        bin_wm_sum=zeros,
        bin_x=zeros,
        bin_values=zeros,
        bin_filled=jnp.zeros((nb,), bool),
    )


def weighted_isotonic(values: jax.Array, weights: jax.Array) -> jax.Array:
    """Weighted non-decreasing isotonic regression of a short vector (e.g. bin means).

    Uses the max-min characterisation of the pool-adjacent-violators solution,
    `f_i = max_{j<=i} min_{k>=i} avg(j..k)`, which is exact, branch-free and jittable;
    O(n^2) memory is nothing for n = number of bins. Entries with zero weight get an arbitrary
    value and must be ignored by the caller.
    """
    n = values.shape[0]
    cw = jnp.concatenate([jnp.zeros(1), jnp.cumsum(weights)])
    cwy = jnp.concatenate([jnp.zeros(1), jnp.cumsum(weights * values)])
    j = jnp.arange(n)[:, None]
    k = jnp.arange(n)[None, :]
    w_jk = cw[k + 1] - cw[j]
    avg = (cwy[k + 1] - cwy[j]) / jnp.where(w_jk > 0, w_jk, 1.0)
    usable = (k >= j) & (w_jk > 0)
    avg = jnp.where(usable, avg, jnp.inf)
    # inner[j, i] = min_{k >= i} avg[j, k]
    inner = jax.lax.cummin(avg, axis=1, reverse=True)
    i = jnp.arange(n)[None, :]
    inner = jnp.where((j <= i) & jnp.isfinite(inner), inner, -jnp.inf)
    return jnp.max(inner, axis=0)


def bin_index(r: jax.Array, config: DebiasConfig) -> jax.Array:
    """Equal-width bin of each score; scores outside the range fall in the end bins."""
    lo, hi = config.reward_range
    nb = config.num_bins
    return jnp.clip(jnp.floor((r - lo) / (hi - lo) * nb).astype(jnp.int32), 0, nb - 1)


def equal_mass_edges(wm: jax.Array, valid: jax.Array, num_bins: int) -> jax.Array:
    """The `num_bins - 1` inner edges of equal-mass bins: the k/num_bins empirical quantiles
    (order statistic `floor(k n / num_bins)`) of the valid scores. Tied scores share a bin, so
    with many ties some bins stay empty."""
    n = jnp.asarray(valid, jnp.int32).sum()
    ordered = jnp.sort(jnp.where(valid, wm, jnp.inf))
    k = jnp.arange(1, num_bins)
    return ordered[jnp.clip(k * n // num_bins, 0, wm.shape[0] - 1)]


def window_bins(wm: jax.Array, valid: jax.Array, config: DebiasConfig) -> jax.Array:
    """Bin of each pair of a window under `config.bin_spacing`."""
    if config.bin_spacing == "equal_mass":
        edges = equal_mass_edges(wm, valid, config.num_bins)
        return jnp.searchsorted(edges, wm, side="right").astype(jnp.int32)
    return bin_index(wm, config)


def fit_monotone_map(wm: jax.Array, env: jax.Array, valid: jax.Array, config: DebiasConfig):
    """Binned isotonic fit of E[r_env | r_wm] from pairs (either bin spacing).

    Returns `(bin_x, bin_values, bin_filled)`: per bin the mean WM score of its pairs, the
    pool-adjacent-violators value of its mean real reward, and whether it holds any pair."""
    idx = window_bins(wm, valid, config)
    w = jnp.asarray(valid, jnp.float32)
    zeros = jnp.zeros(config.num_bins)
    counts = zeros.at[idx].add(w)
    return fit_from_bins(counts, zeros.at[idx].add(w * env), zeros.at[idx].add(w * wm))


def fit_from_bins(counts: jax.Array, sums: jax.Array, wm_sums: jax.Array):
    """Per-bin mean WM score, pool-adjacent-violators over the bin means of the real reward
    (weighted by the bin counts), and which bins are filled."""
    safe = jnp.maximum(counts, 1.0)
    return wm_sums / safe, weighted_isotonic(sums / safe, counts), counts > 0


def apply_monotone_map(
    r: jax.Array,
    bin_x: jax.Array,
    bin_values: jax.Array,
    bin_filled: jax.Array,
    config: DebiasConfig,
) -> jax.Array:
    """The calibrated score: `(1 - min_slope) g(r) + min_slope r`.

    `g` interpolates linearly between the points `(bin_x, bin_values)` of filled bins (each
    bin's mean WM score and its isotonic real reward, the paper's reference formula) and is
    constant beyond the end points. `g` alone is only non-decreasing: a flat PAV segment, a
    group inside one bin's end region or beyond the end points would give different WM scores
    one value and erase the only thing GRPO uses inside a group. The convex blend with the
    identity makes the map strictly increasing (slope >= min_slope everywhere), so it never
    creates a tie and never reorders; it stays non-affine, so it survives group
    standardisation.
    """
    x = r[..., None]
    left_ok = bin_filled & (bin_x <= x)
    right_ok = bin_filled & (bin_x >= x)
    nb = bin_x.shape[0]
    ar = jnp.arange(nb)
    first = jnp.argmax(bin_filled)
    last = nb - 1 - jnp.argmax(bin_filled[::-1])
    li = jnp.where(left_ok.any(-1), jnp.max(jnp.where(left_ok, ar, -1), -1), first)
    ri = jnp.where(right_ok.any(-1), jnp.min(jnp.where(right_ok, ar, nb), -1), last)
    x0, x1 = bin_x[li], bin_x[ri]
    y0, y1 = bin_values[li], bin_values[ri]
    t = jnp.where(ri > li, (r - x0) / jnp.where(ri > li, x1 - x0, 1.0), 0.0)
    g = y0 + jnp.clip(t, 0.0, 1.0) * (y1 - y0)
    return (1.0 - config.min_slope) * g + config.min_slope * r


def update_monotone_map(
    state: MonotoneMapState,
    r_wm: jax.Array,
    r_env: jax.Array,
    valid: jax.Array,
    config: DebiasConfig,
    refit: bool = True,
) -> MonotoneMapState:
    """Append a batch of pairs to the FIFO window, then refit when due.

    With equal-width bins the window's per-bin counts and sums are kept incrementally (add the
    new pairs, subtract the ones they evict), so a refit costs O(num_bins^2) instead of a pass
    over the window. That keeps the estimator cheap enough to run inside a `vmap` over
    thousands of seeds. Equal-mass bins move with the window, so they are refitted from it.

    `refit=False` only appends: the caller then owes a `refit_monotone_map` before the map is
    next applied (see there for why a caller would split the two).
    """
    cap = config.capacity
    valid = jnp.asarray(valid, bool)
    if r_wm.shape[0] > cap:
        raise ValueError(f"a batch of {r_wm.shape[0]} pairs exceeds debias.capacity={cap}")
    r_wm = r_wm.astype(jnp.float32)
    r_env = r_env.astype(jnp.float32)
    offsets = jnp.cumsum(valid.astype(jnp.int32)) - 1
    slots = (state.position + offsets) % cap
    evicted = valid & ((state.size == cap) | (slots < state.size))
    old_wm, old_env = state.wm[slots], state.env[slots]
    if config.bin_spacing == "equal_width":
        old_bins, new_bins = bin_index(old_wm, config), bin_index(r_wm, config)
        vf, ef = valid.astype(jnp.float32), evicted.astype(jnp.float32)

        def moved(total, new, old):
            return total.at[new_bins].add(vf * new).at[old_bins].add(-ef * old)

        state = state.replace(
            bin_count=moved(state.bin_count, 1.0, 1.0),
            bin_sum=moved(state.bin_sum, r_env, old_env),
            bin_wm_sum=moved(state.bin_wm_sum, r_wm, old_wm),
        )
    write = jnp.where(after_reads(valid, old_wm, old_env), slots, cap)  # index cap = dropped
    added = valid.sum().astype(jnp.int32)
    state = state.replace(
        wm=state.wm.at[write].set(r_wm, mode="drop"),
        env=state.env.at[write].set(r_env, mode="drop"),
        position=(state.position + added) % cap,
        size=jnp.minimum(state.size + added, cap),
        since_fit=state.since_fit + added,
    )
    return refit_monotone_map(state, config) if refit else state


def monotone_refit_due(state: MonotoneMapState, config: DebiasConfig) -> jax.Array:
    """Whether the map is due a fit: `min_pairs` stored, and never fitted or `refit_every`
    new pairs since the last fit (docs/method.md 3.4)."""
    return (state.size >= max(config.min_pairs, 1)) & (
        (~state.fitted) | (state.since_fit >= config.refit_every)
    )


def refit_monotone_map(state: MonotoneMapState, config: DebiasConfig) -> MonotoneMapState:
    """Refit the map from the window if it is due; otherwise return it unchanged.

    A fit takes effect only with at least two filled bins (one point defines no map): until
    the first such fit the map stays the identity, and a later fit with fewer keeps the
    previous map, in both cases retrying at the next update (the paper's reference does the
    same).

    Under `jax.vmap` (many estimators, e.g. one per bandit seed) a per-estimator `lax.cond`
    evaluates both branches, so the fit would run at every update. A caller that batches
    estimators can instead append with `update_monotone_map(..., refit=False)` and call this
    outside the vmap under `lax.cond(any estimator due, ...)`: updates where none is due then
    skip the fit entirely, and the ones that are due still refit exactly when they would have.
    """
    if config.bin_spacing == "equal_width":
        fit = fit_from_bins(state.bin_count, state.bin_sum, state.bin_wm_sum)
    else:
        stored = jnp.arange(state.wm.shape[0]) < state.size
        fit = fit_monotone_map(state.wm, state.env, stored, config)
    bin_x, values, filled = fit
    take = monotone_refit_due(state, config) & (filled.sum() >= 2)
    return state.replace(
        bin_x=jnp.where(take, bin_x, state.bin_x),
        bin_values=jnp.where(take, values, state.bin_values),
        bin_filled=jnp.where(take, filled, state.bin_filled),
        fitted=state.fitted | take,
        since_fit=jnp.where(take, 0, state.since_fit),
    )


# ----------------------------------------------------------------------------- the estimator


@struct.dataclass
class DebiasState:
    keyed: KeyedOffsetState
    monotone: MonotoneMapState


def init_debias_state(config: DebiasConfig) -> DebiasState:
    return DebiasState(keyed=init_keyed_offsets(config), monotone=init_monotone_map(config))


def apply_debias(
    state: DebiasState, r_wm: jax.Array, keys: jax.Array | None, config: DebiasConfig
) -> jax.Array:
    """Calibrate WM scores: keyed offsets (if on and ready), then the monotone map (if fitted)."""
    out = r_wm.astype(jnp.float32)
    if config.uses_keyed:
        if keys is None:
            raise ValueError("debias.mode uses keyed offsets but no keys were given")
        offsets, ready = keyed_offsets(state.keyed, config)
        k = jnp.clip(keys.astype(jnp.int32), 0, config.num_keys - 1)
        out = out - jnp.where(ready[k], offsets[k], 0.0)
    if config.uses_monotone:
        m = state.monotone
        mapped = apply_monotone_map(out, m.bin_x, m.bin_values, m.bin_filled, config)
        out = jnp.where(m.fitted, mapped, out)
    return out


def update_debias(
    state: DebiasState,
    r_wm: jax.Array,
    r_env: jax.Array,
    keys: jax.Array | None,
    valid: jax.Array,
    config: DebiasConfig,
    refit: bool = True,
) -> DebiasState:
    """Feed anchor pairs (raw WM score, real reward) into the estimator.

    The map is fitted on keyed-corrected scores, so it sees the same inputs it is applied to.
    `refit=False` defers the map's refit to the caller (`refit_monotone_map`).
    """
    keyed, mono = state.keyed, state.monotone
    r_wm = r_wm.astype(jnp.float32)
    if config.uses_keyed:
        if keys is None:
            raise ValueError("debias.mode uses keyed offsets but no keys were given")
        keyed = update_keyed_offsets(keyed, r_wm, r_env, keys, valid, config)
        offsets, ready = keyed_offsets(keyed, config)
        k = jnp.clip(keys.astype(jnp.int32), 0, config.num_keys - 1)
        r_wm = r_wm - jnp.where(ready[k], offsets[k], 0.0)
    if config.uses_monotone:
        mono = update_monotone_map(mono, r_wm, r_env, valid, config, refit)
    return DebiasState(keyed=keyed, monotone=mono)


def centred_residual(x: jax.Array, y: jax.Array, group_size: int) -> jax.Array:
    """`mean(((x - mean x) - (y - mean y))^2)` within groups, averaged over groups.

    x, y: [N] with contiguous groups of `group_size`. Offsets constant within a group do not
    count, because group standardisation cancels them.
    """
    xg = x.reshape(-1, group_size)
    yg = y.reshape(-1, group_size)
    xc = xg - xg.mean(axis=1, keepdims=True)
    yc = yg - yg.mean(axis=1, keepdims=True)
    return jnp.mean(jnp.square(xc - yc))


def bias_diagnostic(
    raw: jax.Array, calibrated: jax.Array, real: jax.Array, group_size: int
) -> dict[str, jax.Array]:
    """Before/after within-group residual and the relative reduction `1 - after / before`."""
    before = centred_residual(raw, real, group_size)
    after = centred_residual(calibrated, real, group_size)
    reduction = jnp.where(before > 0, 1.0 - after / jnp.maximum(before, 1e-12), 0.0)
    return {"residual_before": before, "residual_after": after, "bias_reduction": reduction}
