"""The script-feature scorer as the trainer's world model (`wm.kind = "features"`).

The baseline the neural WM must beat, run in its place: `FeatureWM` scores a step's
scripts with the ridge regression of `wmrl.autoresearch.script_features` (mean = the WM
score, Gaussian predictive variance = what uncertainty routing reads) and is refitted online
on the anchors' real outcomes, as the neural WM is fine-tuned on them.

* **Before RL** it is fitted on the executed corpus of the training tasks (each script's
  card facts under the limit it ran under, the task's own) and, with
  `wm.policy_samples_per_task` > 0, the fit part of the policy samples (under the RL cap),
  the rows the neural WM pretrains on. No neural pretraining runs; `report` gives the
  held-out figures the summary's `wm_pretrain_heldout` reports for a neural WM.
* **Online** its fit rows are that base plus every real outcome in the run's replay
  (`RunState.replay`, the buffer the neural WM fine-tunes on, `wm.replay_size` rows):
  `fit_to(replay)` refits whenever the replay's content changed since the last fit. The
  scorer is therefore a pure function of the replay: a resumed run restores the replay from
  its checkpoint and scores exactly as the uninterrupted run would, with nothing of its own
  to save. A replay row's script and task are read back from its tokens (the completion
  decodes to the script, the prompt is its task's), each row's features computed once.

Single-turn only (the multi-turn WM also predicts observations, which this scorer does not).
"""

from __future__ import annotations

import time

import numpy as np

from wmrl.autoresearch import data as rldata
from wmrl.autoresearch import script_features as sf

WM_KINDS = ("neural", "features")


class FeatureWM:
    """The feature scorer of one run: `fit_to(replay)` then `predict(scripts, tasks)`."""

    def __init__(self, config, prepared, samples: list[dict] | None = None):
        from wmrl.autoresearch.stages import policy_fit_records

        t0 = time.monotonic()
        self.tok, self.P = prepared.tokenizer, config.data.max_prompt_len
        tasks = prepared.train_tasks + prepared.heldout_tasks
        cap = config.suite.time_limit_s
        # RL runs every script under the task's limit capped by suite.time_limit_s.
        self.facts = {t.id: sf.card_facts(t, cap) for t in tasks}
        own = {t.id: sf.card_facts(t, 0.0) for t in tasks}  # the corpus ran uncapped
        train_ids = {t.id for t in prepared.train_tasks}
        corpus = [r for r in prepared.executions if r["split"] == "train"
                  and r["task_id"] in train_ids and r.get("reward") is not None]  # fmt: skip
        fit = [r for r in policy_fit_records(config, samples or [])
               if r.get("reward") is not None]  # fmt: skip
        rows = [(r["script"], own[r["task_id"]], r["reward"]) for r in corpus]
        rows += [(r["script"], self.facts[r["task_id"]], r["reward"]) for r in fit]
        if len(rows) < 2:
            raise ValueError(f"the feature WM needs at least 2 executed scripts, got {len(rows)}")
        self.base_X = np.stack([sf.features(s, f) for s, f, _ in rows])
        self.base_y = np.array([y for _, _, y in rows], np.float64)
        self.corpus_rows, self.policy_sample_rows = len(corpus), len(fit)
        ids, mask = rldata.encode_prompts(self.tok, [rldata.task_prompt(config, t) for t in tasks],
                                          self.P)  # fmt: skip
        self._task_of_prompt = {ids[i][mask[i]].tobytes(): t.id for i, t in enumerate(tasks)}
        self._heldout = [r for r in prepared.executions if r["split"] == "heldout"
                         and r.get("reward") is not None and r["task_id"] in own]  # fmt: skip
        self._heldout_facts = own
        self._cache: dict[bytes, np.ndarray | None] = {}  # replay row -> its features
        self._fitted_on: tuple | None = None
        self.scorer = sf.FeatureScorer().fit_features(self.base_X, self.base_y)
        self.fit_s = time.monotonic() - t0

    # -- online --------------------------------------------------------------------------

    def _row_features(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
        """One replay row's features (its prompt names the task, its completion decodes to
        the script); None for a row whose prompt is no task's."""
        mask = mask.astype(bool)
        task = self._task_of_prompt.get(tokens[: self.P][mask[: self.P]].tobytes())
        if task is None:
            return None
        script = self.tok.decode(tokens[self.P :][mask[self.P :]])
        return sf.features(script, self.facts[task])

    def fit_to(self, replay) -> None:
        """Refit on the base rows and the replay's real outcomes (slots in order), unless
        the replay holds what the current fit was made on."""
        n = int(replay.count)
        tokens, mask = np.asarray(replay.tokens[:n]), np.asarray(replay.input_mask[:n])
        target = np.asarray(replay.target[:n], np.float64)
        keys = [tokens[i][mask[i]].tobytes() + target[i].tobytes() for i in range(n)]
        signature = tuple(keys)
        if signature == self._fitted_on:
            return
        self._cache = {
            k: self._cache[k] if k in self._cache else self._row_features(tokens[i], mask[i])
            for i, k in enumerate(keys)
        }
        got = [(self._cache[k], target[i]) for i, k in enumerate(keys)
               if self._cache[k] is not None]  # fmt: skip
        X, y = self.base_X, self.base_y
        if got:
            X = np.concatenate([X, np.stack([x for x, _ in got])])
            y = np.concatenate([y, [t for _, t in got]])
        self.scorer = sf.FeatureScorer().fit_features(X, y)
        self._fitted_on = signature

    def predict(self, scripts: list[str], tasks: list) -> dict:
        """The WM outputs the trainer reads for rows of these scripts on these tasks: `score`
        (the ridge mean) and `predictive_var` (its Gaussian predictive variance), `[n]`."""
        X = np.stack([sf.features(s, self.facts[t.id]) for s, t in zip(scripts, tasks,
                                                                        strict=True)])  # fmt: skip
        mean, var = self.scorer.predict_features(X)
        return {"score": mean.astype(np.float32), "predictive_var": var.astype(np.float32)}

    # -- report --------------------------------------------------------------------------

    def report(self) -> dict:
        """What the summary reports of a WM before RL: the fit (rows, penalty, seconds) and
        the scorer on the held-out tasks' executed corpus (`heldout`: within-task Spearman,
        Spearman, RMSE), as the neural WM's pretraining report has them."""
        from wmrl.autoresearch.anchor_metrics import spearman
        from wmrl.autoresearch.wm_metrics import within_task_spearman

        held = {"n": len(self._heldout)}
        if self._heldout:
            X = np.stack([sf.features(r["script"], self._heldout_facts[r["task_id"]])
                          for r in self._heldout])  # fmt: skip
            s, _ = self.scorer.predict_features(X)
            y = np.array([r["reward"] for r in self._heldout], np.float64)
            group = np.array([r["task_id"] for r in self._heldout])
            held.update(
                within_task_spearman=within_task_spearman(s, y, group),
                spearman=spearman(s, y), rmse=float(np.sqrt(np.mean((s - y) ** 2))),
            )  # fmt: skip
        return {
            "kind": "features", "corpus_rows": self.corpus_rows,
            "policy_sample_rows": self.policy_sample_rows, "features": len(sf.FEATURE_NAMES),
            "penalty": self.scorer.penalty, "heldout": held, "time_s": self.fit_s,
        }  # fmt: skip
