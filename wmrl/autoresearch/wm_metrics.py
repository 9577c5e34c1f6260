"""The world model's report on executed rows (what the WM pretraining stage saves in its
`done.json` and `wmrl.benchmarks.wm_quality` reads): calibration (interval ECE), pooled and
within-task Spearman of WM score vs real reward, RMSE and, with the runtime head, how well it
ranks runtimes and predicts time-outs. Host-side numpy over the scores of a jitted scorer."""

from __future__ import annotations

import numpy as np

from wmrl import distributed
from wmrl.autoresearch import model_setup
from wmrl.core.stats import auc, interval_ece, spearman


def within_task_spearman(scores: np.ndarray, targets: np.ndarray, group: np.ndarray) -> dict:
    """Mean over tasks of the Spearman correlation of WM score vs real reward among one task's
    scripts (what GRPO uses), over the tasks where it is defined (both sides vary)."""
    corrs = []
    for g in np.unique(group):
        s, y = scores[group == g], targets[group == g]
        if len(s) >= 2 and np.ptp(s) > 0 and np.ptp(y) > 0:
            corrs.append(float(spearman(s, y)))
    return {"mean": float(np.mean(corrs)) if corrs else None, "tasks": len(corrs)}


def runtime_report(pred: dict, rows: dict, keep: np.ndarray) -> dict:
    """The runtime head on the graded rows `keep`: Spearman and Pearson of predicted vs real
    log runtime over the scripts that ran and finished (a time-out's runtime is only a lower
    bound), and the ROC AUC of `p_timeout` for the scripts that timed out."""
    from wmrl.autoresearch.env.grader import Status

    rt, label = rows["runtime"][keep], rows["class_label"][keep]
    timed_out = label == int(Status.TIMEOUT)
    done = np.isfinite(rt) & ~timed_out
    p, q = np.log(pred["runtime_s"][done]), np.log(np.maximum(rt[done], model_setup.MIN_RUNTIME_S))
    ok = done.sum() >= 3 and np.ptp(p) > 0 and np.ptp(q) > 0
    return {
        "runtime_spearman": float(spearman(p, q)) if ok else None,
        "runtime_pearson": float(np.corrcoef(p, q)[0, 1]) if ok else None,
        "runtime_rows": int(done.sum()),
        "timeout_auc": auc(pred["p_timeout"], timed_out),
        "timeouts": int(timed_out.sum()),
        "mean_p_timeout": float(pred["p_timeout"].mean()),
    }


def predict_rows(score_fn, params, rows: dict, keep: np.ndarray, batch: int = 64) -> dict:
    """The WM's outputs on rows `keep` (`score`, `predictive_var` and, with the runtime head,
    `score_raw`, `p_timeout`, `runtime_s`), each `[len(keep)]`, under each row's
    `time_limit_s`, in fixed-size batches (one compiled shape)."""
    got: dict[str, list] = {}
    for i in range(0, len(keep), batch):
        idx = keep[i : i + batch]
        pad = batch - len(idx)
        sel = np.concatenate([idx, np.repeat(idx[-1:], pad)])
        limits = rows["time_limit_s"][sel] if "time_limit_s" in rows else None
        out = score_fn(params, rows["tokens"][sel], rows["input_mask"][sel], limits)
        names = ("score", "predictive_var", "score_raw", "p_timeout", "runtime_s")
        out = distributed.process_allgather_to_numpy({k: out[k] for k in names if k in out})
        for k, v in out.items():
            got.setdefault(k, []).append(v[: len(idx)])
    return {k: np.concatenate(v) for k, v in got.items()}


def wm_report(score_fn, params, rows: dict, batch: int = 64, keep_scores: bool = True) -> dict:
    """Calibration (interval ECE from the predictive variance) and Spearman rank correlation
    of WM score vs real reward (pooled, and within each task), over the graded rows; with
    `keep_scores` also the scores and targets themselves. With the runtime head the score is
    the time-out-aware one under each row's `time_limit_s`, and the report adds the reward
    head's own within-task Spearman (`within_task_spearman_raw`) and `runtime_report`."""
    keep = np.nonzero(rows["valid"])[0]
    pred = predict_rows(score_fn, params, rows, keep, batch)
    s, v, y = pred["score"], pred["predictive_var"], rows["target"][keep]
    report = {
        "n": len(keep),
        "ece": float(interval_ece(s, v, y)),
        "spearman": float(spearman(s, y, undefined=0.0)),
        "within_task_spearman": within_task_spearman(s, y, rows["group"][keep]),
        "rmse": float(np.sqrt(np.mean((s - y) ** 2))),
        **({"scores": s.tolist(), "targets": y.tolist()} if keep_scores else {}),
    }
    if "p_timeout" in pred:
        raw = within_task_spearman(pred["score_raw"], y, rows["group"][keep])
        report["within_task_spearman_raw"] = raw
        report.update(runtime_report(pred, rows, keep))
    return report
