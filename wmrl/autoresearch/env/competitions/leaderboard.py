"""A competition's leaderboards: the reward ladder's reference, and the benchmark's verdict.

An imported competition keeps its leaderboards under ``private/`` (listed in the task's
``competition.leaderboards``): never in the sandbox's view, and never in the ``Task`` either
(``Task.reference_scores`` is empty for a competition), because the task travels with every
execution's job into the supervisor, whose memory a prefork script inherits. The grader
reads them from disk when it grades.

* Reward ladder: a VALID submission's percentile is its mid-rank among the scores of the
  reference board (``REFERENCE_BOARD``: MLE-bench's leaderboard; MLE-Dojo's private
  leaderboard, its public one where there is no private one), as for every task
  (``metrics.percentile``).
* MLE-bench's medals (``mlebench_outcome``): the score rounded to 5 decimals is compared
  with thresholds taken at positions of the leaderboard, best first, that depend on the
  number of teams n (Kaggle's progression rules, as MLE-bench applies them):

      n < 100          gold at max(1, int(0.1 n)), silver at max(1, int(0.2 n)),
                       bronze at max(1, int(0.4 n))
      100 <= n < 250   gold at 10, silver and bronze as above
      250 <= n < 1000  gold at 10 + int(0.002 n), silver at 50, bronze at 100
      n >= 1000        gold at 10 + int(0.002 n), silver at max(1, int(0.05 n)),
                       bronze at max(1, int(0.1 n))

  A score reaching a threshold (ties count) earns that medal, the best one only;
  "above median" is strictly better than the median of all scores. Its position score on
  the one leaderboard (below) is recorded too, so every competition has one.
* MLE-Dojo's position score (``mledojo_outcome``): on each leaderboard of n scores sorted
  best first, the position is 1 + the number of scores strictly better than the
  submission's, and the position score (n - position + 1) / n; the average over the
  private and public leaderboards (those the competition has).

A submission that is not VALID has no score: no medal, not above the median, position
score 0 (it ranks below every entry); its record says so (``no_score_outcome``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

BENCHMARKS = ("mlebench", "mledojo")
# The board a VALID submission's percentile is computed on, by preference.
REFERENCE_BOARD = {"mlebench": ("leaderboard",), "mledojo": ("private", "public")}
BOARD_NAMES = {"mlebench": ("leaderboard",), "mledojo": ("private", "public")}
MLEBENCH_DECIMALS = 5  # MLE-bench rounds a score to 5 decimals before ranking it


def read_board(path: str | Path) -> np.ndarray:
    """A leaderboard file's ``score`` column in file order (best first) as floats; a
    ValueError naming the file and the problem otherwise."""
    path = Path(path)
    st = path.stat()
    return _cached_board(str(path), st.st_mtime_ns, st.st_size).copy()


@functools.lru_cache(maxsize=64)
def _cached_board(path: str, mtime_ns: int, size: int) -> np.ndarray:
    del mtime_ns, size  # cache key only
    try:
        board = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"leaderboard {path} is not a readable CSV ({e})") from e
    if "score" not in board.columns:
        raise ValueError(f"leaderboard {path} has no 'score' column (has {list(board.columns)})")
    scores = pd.to_numeric(board["score"], errors="coerce").to_numpy(float)
    if len(scores) == 0:
        raise ValueError(f"leaderboard {path} has no rows")
    bad = int(np.sum(~np.isfinite(scores)))
    if bad:
        raise ValueError(f"leaderboard {path}: {bad} of {len(scores)} scores are not numbers")
    return scores


def ordered_lower_is_better(scores: np.ndarray) -> bool | None:
    """What a leaderboard's order says of its metric (MLE-bench's reading: the first score
    below the last means lower is better); None when first and last are equal."""
    if scores[0] == scores[-1]:
        return None
    return bool(scores[0] < scores[-1])


@dataclasses.dataclass(frozen=True)
class Thresholds:
    gold: float
    silver: float
    bronze: float
    median: float


def medal_positions(n: int) -> tuple[int, int, int]:
    """The 1-based leaderboard positions of the gold, silver and bronze thresholds for a
    leaderboard of ``n`` teams (the module docstring's table)."""
    if n < 1:
        raise ValueError("a leaderboard needs at least one team")
    if n < 100:
        return max(1, int(n * 0.1)), max(1, int(n * 0.2)), max(1, int(n * 0.4))
    if n < 250:
        return 10, max(1, int(n * 0.2)), max(1, int(n * 0.4))
    if n < 1000:
        return 10 + int(n * 0.002), 50, 100
    return 10 + int(n * 0.002), max(1, int(n * 0.05)), max(1, int(n * 0.1))


def medal_thresholds(scores: np.ndarray) -> Thresholds:
    """The scores at the medal positions of a best-first leaderboard, and its median."""
    gold, silver, bronze = (float(scores[p - 1]) for p in medal_positions(len(scores)))
    return Thresholds(gold, silver, bronze, float(np.median(scores)))


def no_score_outcome(benchmark: str) -> dict:
    """A benchmark's verdict on a submission that is not VALID: no score, no medal, not above
    the median, position score 0 (it ranks below every entry). No leaderboard is needed."""
    if benchmark == "mlebench":
        return {"benchmark": "mlebench", "score": None, "medal": None, "any_medal": False,
                "above_median": False, "position_score": 0.0}  # fmt: skip
    if benchmark == "mledojo":
        return {"benchmark": "mledojo", "score": None, "position_score": 0.0, "positions": {}}
    raise ValueError(f"unknown benchmark {benchmark!r} (known: {BENCHMARKS})")


def mlebench_outcome(score: float | None, scores: np.ndarray, higher_is_better: bool) -> dict:
    """MLE-bench's verdict on a score (None: not VALID) against a best-first leaderboard."""
    if score is None:
        return no_score_outcome("mlebench")
    rounded = round(float(score), MLEBENCH_DECIMALS)
    t = medal_thresholds(scores)
    reaches = (lambda x: rounded >= x) if higher_is_better else (lambda x: rounded <= x)
    medal = next((m for m, x in (("gold", t.gold), ("silver", t.silver),
                                 ("bronze", t.bronze)) if reaches(x)), None)  # fmt: skip
    above = rounded > t.median if higher_is_better else rounded < t.median
    p, n = position(rounded, scores, higher_is_better), len(scores)
    return {"benchmark": "mlebench", "score": rounded, "medal": medal,
            "any_medal": medal is not None, "above_median": bool(above),
            "position_score": (n - p + 1) / n}  # fmt: skip


def position(score: float, scores: np.ndarray, higher_is_better: bool) -> int:
    """1 + how many of the leaderboard's scores are strictly better than ``score``."""
    better = scores > score if higher_is_better else scores < score
    return 1 + int(np.sum(better))


def mledojo_outcome(
    score: float | None, boards: dict[str, np.ndarray], higher_is_better: bool
) -> dict:
    """MLE-Dojo's verdict: the position on each leaderboard and the position score
    (n - position + 1) / n averaged over them (0 for a score of None)."""
    if score is None:
        return no_score_outcome("mledojo")
    positions = {}
    for name, scores in boards.items():
        p, n = position(score, scores, higher_is_better), len(scores)
        positions[name] = {"position": p, "total": n, "position_score": (n - p + 1) / n}
    mean = float(np.mean([v["position_score"] for v in positions.values()]))
    return {"benchmark": "mledojo", "score": float(score), "position_score": mean,
            "positions": positions}  # fmt: skip


def boards_of(task) -> dict[str, np.ndarray]:
    """A competition task's leaderboards by name, read from its ``private/``."""
    spec = task.competition
    return {name: read_board(task.root / "private" / rel)
            for name, rel in spec["leaderboards"].items()}  # fmt: skip


def reference_scores(task, boards: dict[str, np.ndarray] | None = None) -> np.ndarray:
    """The scores a VALID submission's percentile is computed on (``REFERENCE_BOARD``)."""
    boards = boards_of(task) if boards is None else boards
    for name in REFERENCE_BOARD[task.competition["benchmark"]]:
        if name in boards:
            return boards[name]
    raise ValueError(f"competition task {task.id} has no leaderboard to rank on")


def benchmark_outcome(task, score: float | None, boards: dict | None = None) -> dict:
    """The benchmark's own verdict on a competition task's score (None: not VALID)."""
    if score is not None and not math.isfinite(score):
        raise ValueError(f"score {score} is not a finite number")
    boards = boards_of(task) if boards is None else boards
    higher = task.metric.higher_is_better
    if task.competition["benchmark"] == "mlebench":
        return mlebench_outcome(score, boards["leaderboard"], higher)
    return mledojo_outcome(score, boards, higher)
