"""What the static check cannot see, measured on a run's anchor pairs.

The static check (`rl.static_check`) fixes the reward of the scripts it can judge without
executing them (they do not compile, or read a name they never define), and it is never
wrong. A world model earns its cost only on the other rows, the *learned* rows: these
figures measure the WM there, on the anchors (scripts executed anyway, so the real outcome
is known), from the records of `pairs.jsonl` (`wmrl.autoresearch.step.anchor_pairs`):

* `learned_spearman`: the within-group Spearman correlation of the WM score with the real
  reward over each anchor group's learned rows (what GRPO uses; the trainer's
  `wm_stream_corr`), averaged over groups.
* `stream_spearman`: the same over all of a group's rows, the static check's exact reward
  replacing the WM score where it decides (the WM stream as RL sees it).
* `failure_auc`: ROC AUC of the WM score for VALID against any failure among the learned
  rows pooled (can it tell a script that will run and submit from one that will not?).
* `valid_spearman`: the within-group Spearman among the VALID rows only (the leaderboard
  percentile, what is left once every script works).
* `timeout_calibration`: the WM's P(timeout) under the limit the script ran under (the task's,
  capped by `suite.time_limit_s`) against the observed time-outs: mean predicted against
  observed rate, Brier score, AUC and a binned reliability table. Needs a `p_timeout` field;
  an episode's record (multi-turn) has none of its own and is measured per turn instead, over
  its executed turns the static check does not decide (`turn_p_timeout`, `turn_status`,
  `turn_static`).

A group is one step's scripts of one task (`(step, task_id)`). Within a group the Spearman
correlation gives ties their average rank; a group whose real rewards differ but whose
scores are all equal counts 0 (no order is no agreement, not a missing measurement); a
group with fewer than two rows or equal real rewards says nothing and is skipped.
`anchor_report` gives every figure over the whole run and per quarter of it, so a WM that
falls behind the moving policy shows as a falling figure. Pure functions over lists of
dicts: the same code measures the offline figures (`wmrl.benchmarks.wm_quality`, on
held-out policy samples laid out as pairs).

    python -m wmrl.autoresearch.anchor_metrics RUN_DIR    # pairs.jsonl + config.json
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from wmrl.autoresearch.env.grader import Status, reward

VALID = int(Status.VALID)
TIMEOUT = int(Status.TIMEOUT)
UNGRADED = int(Status.UNGRADED)


def spearman(x, y) -> float | None:
    """Spearman correlation of two equal-length sequences (ties at their average rank);
    None when undefined (fewer than two values, or no variation on either side)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(rankdata(x), rankdata(y))[0, 1])


def agreement(scores, real) -> float | None:
    """One group's figure: the Spearman correlation of `scores` with `real`, 0 when the real
    values differ but the scores are all equal, None when the real values say nothing."""
    scores, real = np.asarray(scores, float), np.asarray(real, float)
    if len(real) < 2 or np.ptp(real) == 0:
        return None
    if np.ptp(scores) == 0:
        return 0.0
    return spearman(scores, real)


def static_reward(pair: dict) -> float | None:
    """The reward the static check fixes for an anchor pair's script (`static_status`; a
    record with only `static` set was MALFORMED), None where it does not decide."""
    verdict = pair.get("static_status") or ("MALFORMED" if pair.get("static") else None)
    return None if verdict is None else reward(Status[verdict])


def is_learned(pair: dict) -> bool:
    """A row the static check does not decide: the WM alone scores it."""
    return static_reward(pair) is None


def groups(pairs: list[dict]) -> dict[tuple, list[dict]]:
    """Pairs by anchor group: (step, task_id), in order of first appearance."""
    out: dict[tuple, list[dict]] = {}
    for p in pairs:
        out.setdefault((p["step"], p["task_id"]), []).append(p)
    return out


def _group_mean(
    pairs: list[dict], keep: Callable[[dict], bool], value: Callable[[dict], float]
) -> dict:
    """Mean over groups of `agreement(value, r_env)` over each group's rows that `keep`
    accepts: `{"mean", "groups" (where defined), "flat" (of those, groups scored flat)}`."""
    got = []
    flat = 0
    for rows in groups(pairs).values():
        rows = [p for p in rows if keep(p)]
        a = agreement([value(p) for p in rows], [p["r_env"] for p in rows])
        if a is None:
            continue
        got.append(a)
        flat += bool(np.ptp([value(p) for p in rows]) == 0)
    return {"mean": float(np.mean(got)) if got else None, "groups": len(got), "flat": flat}


def learned_spearman(pairs: list[dict], score: str = "r_wm") -> dict:
    """Within-group Spearman of `score` with the real reward over the learned rows."""
    return _group_mean(pairs, is_learned, lambda p: p[score])


def stream_spearman(pairs: list[dict], score: str = "r_wm") -> dict:
    """Within-group Spearman of the WM stream (the static check's reward where it decides,
    else `score`) with the real reward over all rows."""

    def stream(p: dict) -> float:
        fixed = static_reward(p)
        return p[score] if fixed is None else fixed

    return _group_mean(pairs, lambda p: True, stream)


def valid_spearman(pairs: list[dict], score: str = "r_wm") -> dict:
    """Within-group Spearman of `score` with the real reward among the VALID rows."""
    return _group_mean(pairs, lambda p: p["status"] == VALID, lambda p: p[score])


def auc(scores, positive) -> float | None:
    """ROC AUC of `scores` for the boolean `positive` (ties count one half); None unless
    both classes occur."""
    scores, positive = np.asarray(scores, float), np.asarray(positive, bool)
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return None
    greater = (pos[:, None] > neg[None, :]).mean()
    ties = (pos[:, None] == neg[None, :]).mean()
    return float(greater + 0.5 * ties)


def failure_auc(pairs: list[dict], score: str = "r_wm") -> dict:
    """AUC of `score` for VALID against any failure, over the learned rows pooled."""
    rows = [p for p in pairs if is_learned(p)]
    valid = [p["status"] == VALID for p in rows]
    return {
        "auc": auc([p[score] for p in rows], valid),
        "valid": int(sum(valid)),
        "failures": len(rows) - int(sum(valid)),
    }


def timeout_rows(pairs: list[dict]) -> list[tuple[float, bool]]:
    """(P(timeout), timed out) of every executed script the static check does not decide and
    the WM gave a P(timeout): a single-turn pair's learned row, or each such turn of an
    episode's record (`turn_p_timeout`; a turn with an infrastructure failure is left out)."""
    out = []
    for p in pairs:
        if "turn_p_timeout" in p:
            turns = zip(p["turn_p_timeout"], p["turn_status"], p["turn_static"], strict=True)
            out += [(pt, s == TIMEOUT) for pt, s, fixed in turns if not fixed and s != UNGRADED]
        elif is_learned(p) and p.get("p_timeout") is not None:
            out.append((p["p_timeout"], p["status"] == TIMEOUT))
    return out


def timeout_calibration(pairs: list[dict], bins: int = 5) -> dict | None:
    """The WM's P(timeout) against the observed time-outs over the scripts of `timeout_rows`
    (single-turn: the learned rows that carry a `p_timeout`; multi-turn: the learned turns):
    `mean_p` against `rate`, the Brier score, the AUC, and `bins` equal-width bins of
    P(timeout) (`[lo, hi, rows, mean_p, rate]`, empty bins left out). None when no script
    carries a P(timeout)."""
    rows = timeout_rows(pairs)
    if not rows:
        return None
    p = np.asarray([pt for pt, _ in rows], float)
    y = np.asarray([to for _, to in rows], float)
    edges = np.linspace(0.0, 1.0, bins + 1)
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, bins - 1)
    table = [
        [float(edges[b]), float(edges[b + 1]), int((which == b).sum()),
         float(p[which == b].mean()), float(y[which == b].mean())]
        for b in range(bins) if (which == b).any()
    ]  # fmt: skip
    return {
        "rows": len(rows),
        "timeouts": int(y.sum()),
        "mean_p": float(p.mean()),
        "rate": float(y.mean()),
        "brier": float(np.mean((p - y) ** 2)),
        "auc": auc(p, y.astype(bool)),
        "bins": table,
    }


def variance_shares(pairs: list[dict]) -> dict:
    """Where the within-group variance of the real reward is, pooled over groups: `status`,
    the share between reward levels (each row replaced by its group's mean reward of its
    status); `static`, the share the static check explains (its rows' exact rewards known,
    the others replaced by their group's mean of the learned rows); `total`, the pooled
    within-group sum of squares. None for a share when there is no variance."""
    total = by_status = left = 0.0
    for rows in groups(pairs).values():
        r = np.array([p["r_env"] for p in rows], float)
        total += float(((r - r.mean()) ** 2).sum())
        status = np.array([p["status"] for p in rows])
        means = {s: r[status == s].mean() for s in set(status.tolist())}
        by_status += float(sum((means[s] - r.mean()) ** 2 for s in status.tolist()))
        learned = r[[is_learned(p) for p in rows]]
        left += float(((learned - learned.mean()) ** 2).sum()) if len(learned) else 0.0
    share = lambda x: x / total if total > 0 else None
    return {"total": total, "status": share(by_status), "static": share(total - left)}


def quarters(pairs: list[dict], steps: int | None = None) -> list[list[dict]]:
    """The pairs of each quarter of a run of `steps` RL steps (default: the last step seen):
    quarter q holds the steps in `(q * steps / 4, (q + 1) * steps / 4]`."""
    if not pairs:
        return [[], [], [], []]
    steps = steps or max(p["step"] for p in pairs)
    out: list[list[dict]] = [[], [], [], []]
    for p in pairs:
        q = min(int(np.ceil(4 * p["step"] / steps)) - 1, 3)
        out[max(q, 0)].append(p)
    return out


def figures(pairs: list[dict], score: str = "r_wm") -> dict:
    """Every figure of this module over `pairs`."""
    return {
        "pairs": len(pairs),
        "learned_rows": sum(map(is_learned, pairs)),
        "learned_spearman": learned_spearman(pairs, score),
        "stream_spearman": stream_spearman(pairs, score),
        "failure_auc": failure_auc(pairs, score),
        "valid_spearman": valid_spearman(pairs, score),
        "timeout_calibration": timeout_calibration(pairs),
    }


def anchor_report(pairs: list[dict], steps: int | None = None, score: str = "r_wm") -> dict:
    """`figures` over the whole run (`all`) and over each quarter of it (`quarters`)."""
    return {
        "all": figures(pairs, score),
        "quarters": [figures(q, score) for q in quarters(pairs, steps)],
    }


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        raise SystemExit("usage: python -m wmrl.autoresearch.anchor_metrics RUN_DIR")
    run = Path(argv[1])
    from wmrl.jsonl import read_jsonl

    pairs = read_jsonl(run / "pairs.jsonl")
    if not pairs:
        raise SystemExit(f"{run / 'pairs.jsonl'}: no anchor pairs")
    config = run / "config.json"
    steps = json.loads(config.read_text())["rl"]["steps"] if config.exists() else None
    print(json.dumps(anchor_report(pairs, steps), indent=2))


if __name__ == "__main__":
    main(sys.argv)
