"""Executed multi-turn SFT episodes: the author's episodes run for real on episode tasks.

    python -m wmrl.autoresearch.env.multiturn_corpus --suite=DIR --data_dir=DIR \\
        [--episodes_per_task=8] [--turns=2] [--workers=N]

Each training-split task gets ``episodes_per_task`` episodes from ``author.write_episodes``
(a fix episode: a script with one controlled mistake, then that script corrected; an improve
episode: a good script with a weak model, then stronger candidates). Every turn is executed
once on the task's episode task (``episode.make_episode_task``, built under ``task_root``),
each turn submitted as soon as the one before it is graded, with enough episodes in flight to
keep the pool full. An improvement candidate that is
not VALID with a better validation score than the best turn so far is replaced by that best
script (``action: "keep"``, its observation copied, not executed again): later turns keep or
improve a good first script, judged on the validation split only.

Each finished episode is appended to ``<data_dir>/episodes.jsonl`` (flushed and fsynced); a
rerun skips the episodes already there, so an interrupted build keeps what it finished (an
episode cut mid-way is executed again from turn 1, with the same execution keys and so the
same seeds). A record:

    {"task_id", "index", "split", "kind": "fix" | "improve", "mistake", "metric",
     "turns": [{"turn", "script", "model", "mistake", "action": "write" | "fix" | "improve"
                | "keep", "executed", "observation": {status, status_id, error_type,
                runtime_s, validation}, "observation_text", "status", "status_name",
                "reward", "score", "percentile"}, ...]}

``observation`` / ``observation_text`` are what the agent may read (``observation.py``);
``reward``, ``score`` and ``percentile`` come from the hidden test rows and are training
targets only (e.g. for the world model), never part of a prompt.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import json
import math
import os
import zlib
from pathlib import Path

from absl import app, flags

from wmrl.autoresearch.env import author
from wmrl.autoresearch.env.dataset import journal_records
from wmrl.autoresearch.env.episode import make_episode_task
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.make_task import task_info
from wmrl.autoresearch.env.observation import observation_of, render_observation
from wmrl.autoresearch.env.task import Task, load_suite


def episode_seed(task_id: str, seed: int) -> int:
    """A stable per-task seed for its episodes, apart from the single-turn corpus's."""
    return zlib.crc32(f"{task_id}:{seed}:episodes".encode())


def _better(a: float, b: float, higher_is_better: bool) -> bool:
    return a > b if higher_is_better else a < b


def _turn_record(turn: int, source: str, spec, action: str, result, metric: str) -> dict:
    obs = observation_of(result)
    return {
        "turn": turn,
        "script": source,
        "model": spec.model,
        "mistake": spec.mistake or "",
        "action": action,
        "executed": True,
        "observation": obs.to_json(),
        "observation_text": render_observation(obs, metric),
        "status": int(result.status),
        "status_name": result.status.name,
        "reward": None if math.isnan(result.reward) else result.reward,
        "score": result.score,
        "percentile": result.percentile,
    }


class _Episode:
    """One episode being executed: its plan, sources and the turns recorded so far."""

    def __init__(self, task: Task, index: int, plan: author.EpisodePlan, sources):
        self.task, self.index, self.plan, self.sources = task, index, plan, sources
        self.turns: list[dict] = []
        self.best: int | None = None  # the turn with the best validation score so far

    def action(self, t: int) -> str:
        if t == 0:
            return "write"
        return "fix" if self.plan.kind == "fix" and t == 1 else "improve"

    def add(self, t: int, result) -> None:
        metric = self.task.metric
        rec = _turn_record(
            t + 1, self.sources[t], self.plan.specs[t], self.action(t), result, metric.name
        )
        val = rec["observation"]["validation"]
        best_val = None if self.best is None else self.turns[self.best]["observation"]["validation"]
        improves = val is not None and (
            best_val is None or _better(val, best_val, metric.higher_is_better)
        )
        if rec["action"] == "improve" and not improves and self.best is not None:
            rec = {**self.turns[self.best], "turn": t + 1, "action": "keep", "executed": False}
        elif improves:
            self.best = t
        self.turns.append(rec)

    def record(self) -> dict:
        return {
            "task_id": self.task.id,
            "index": self.index,
            "split": self.task.split,
            "kind": self.plan.kind,
            "mistake": self.plan.mistake or "",
            "metric": self.task.metric_name,
            "turns": self.turns,
        }


def execute_episodes(
    suite_dir: str | os.PathLike,
    data_dir: str | os.PathLike,
    task_root: str | os.PathLike | None = None,
    episodes_per_task: int = 8,
    turns: int = 2,
    seed: int = 0,
    fix_fraction: float = 0.6,
    split: str | None = "train",
    workers: int | None = None,
    progress: bool = True,
    executor_config=None,
) -> Path:
    """Execute the authored multi-turn episodes, resumably; return the episodes.jsonl path.

    ``task_root``: where the episode tasks are built (default ``<data_dir>/tasks``); ``split``:
    which suite tasks (None: all; the default keeps held-out tasks out of the warm start)."""
    from tqdm import tqdm

    from wmrl.autoresearch.env.executor import make_executor

    if turns < 2:
        raise ValueError(f"turns must be >= 2 for multi-turn episodes, got {turns}")
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    task_root = Path(task_root) if task_root is not None else data_dir / "tasks"
    log_path = data_dir / "episodes.jsonl"
    done = {(rec["task_id"], rec["index"]) for rec in journal_records(log_path)}
    pending: list[_Episode] = []
    for task in load_suite(suite_dir, split=split):
        info = task_info(task)
        planned = author.write_episodes(
            info, episodes_per_task, episode_seed(task.id, seed), turns, fix_fraction
        )
        todo = [(i, p) for i, p in enumerate(planned) if (task.id, i) not in done]
        if not todo:
            continue
        ep_task = make_episode_task(task, task_root)
        pending += [_Episode(ep_task, i, plan, sources) for i, (plan, sources) in todo]
    if not pending:
        return log_path
    pool = make_executor(executor_config, workers=workers, time_limit_cap_s=0, seed=seed)
    bar = tqdm(total=len(pending) * turns, desc="episodes", disable=not progress)
    waiting = collections.deque(pending)
    window = 2 * max(1, pool.num_workers)  # episodes in flight: the pool stays full
    inflight: dict[cf.Future, tuple[_Episode, int]] = {}

    def start(ep: _Episode, t: int) -> None:
        key = f"{ep.task.id}/episode{ep.index}/{t}"  # a resumed build gets the same seeds
        inflight[pool.submit(ep.task, ep.sources[t], key=key)] = (ep, t)

    with pool, open(log_path, "a") as log:
        while waiting or inflight:
            while waiting and len(inflight) < window:
                start(waiting.popleft(), 0)
            finished, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
            for fut in finished:
                ep, t = inflight.pop(fut)
                ep.add(t, fut.result())
                bar.update(1)
                if t + 1 < turns:
                    start(ep, t + 1)
                else:
                    log.write(json.dumps(ep.record()) + "\n")
                    log.flush()
                    os.fsync(log.fileno())
    bar.close()
    return log_path


def read_episodes(path: str | os.PathLike) -> list[dict]:
    """The records of an episodes.jsonl, sorted by (task id, index)."""
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return sorted(recs, key=lambda r: (r["task_id"], r["index"]))


def ungraded_turns(records: list[dict]) -> int:
    """How many executed turns the sandbox could not grade (infrastructure failures)."""
    return sum(
        t["executed"] and t["status"] == int(Status.UNGRADED) for r in records for t in r["turns"]
    )


FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_string("suite", None, "built suite directory")
    flags.DEFINE_string("data_dir", None, "output directory (episodes.jsonl, tasks/)")
    flags.DEFINE_integer("episodes_per_task", 8, "authored episodes per training task")
    flags.DEFINE_integer("turns", 2, "turns per episode (>= 2)")
    flags.DEFINE_integer("workers", None, "sandbox slots (default: cores)")
    flags.DEFINE_integer("seed", 0, "author seed")


def main(argv) -> None:
    del argv
    if not FLAGS.suite or not FLAGS.data_dir:
        raise app.UsageError("--suite and --data_dir are required")
    path = execute_episodes(
        FLAGS.suite,
        FLAGS.data_dir,
        episodes_per_task=FLAGS.episodes_per_task,
        turns=FLAGS.turns,
        seed=FLAGS.seed,
        workers=FLAGS.workers,
    )
    recs = read_episodes(path)
    print(json.dumps({"episodes": str(path), "count": len(recs), "ungraded": ungraded_turns(recs)}))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
