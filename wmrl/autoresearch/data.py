"""The data stage: task suite, executed corpus, tokenizer; and the token layout of a trajectory.

Layout (shared by SFT, sampling, the policy loss and the world model): a row of
`P + N` tokens, the prompt left-padded to `P = data.max_prompt_len` (BOS, the prompt text,
the script separator) and the script right after it (`N = data.max_new_tokens` tokens,
EOS-terminated, then padding). Generation produces exactly this layout, so the WM scores
sampled scripts in the same format it was pretrained on.

The prompt is the task card's facts (type, metric, target and id columns, rows, limits) plus
a one-line data summary (missing values? categorical columns?): the full column tables of
wide tasks do not fit a tiny context.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from wmrl.autoresearch import pretrained
from wmrl.autoresearch.env.dataset import SEP, corpus_records, execute_corpus
from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.make_task import task_info
from wmrl.autoresearch.env.observation import ERROR_TYPES, error_type_of
from wmrl.autoresearch.env.task import Task, load_suite
from wmrl.config_errors import ConfigError
from wmrl.tokenizer import Tokenizer

PROMPT_FORMAT = 2  # bump when prompt_text changes: tokenizers trained on the old one are stale
# Multi-turn (env.turns > 1): the episode tasks (validation split carved from train.csv) are
# built under <data_dir>/EPISODE_TASKS, the executed SFT episodes are <data_dir>/episodes.jsonl.
EPISODE_TASKS = "episode_tasks"


def prompt_text(task: Task) -> str:
    """The card's facts (its `- ` lines: type, metric, target and id columns, rows, limits)
    plus a one-line data summary, ending with the script separator. The task's name and
    free-text description are left out so a held-out task's prompt looks like the training
    prompts in everything but its facts."""
    header = task.card.split("## Columns")[0]
    facts = [line for line in header.splitlines() if line.startswith("- ")]
    info = task_info(task)
    data = [
        "has missing values" if info.has_missing else "no missing values",
        "has categorical columns" if info.has_categorical else "all numeric",
    ]
    return "\n".join([*facts, f"- Data: {', '.join(data)}"]) + "\n" + SEP


def task_prompt(config, task: Task) -> str:
    """What the policy and the WM are conditioned on: `prompt_text` in the pretrained
    checkpoint's prompt template, if any (`wmrl.autoresearch.pretrained`)."""
    return pretrained.prompt(config, prompt_text(task))


@dataclasses.dataclass
class Prepared:
    suite_dir: Path
    train_tasks: list[Task]
    heldout_tasks: list[Task]
    executions: list[dict]  # the executed corpus (all suite tasks; split tells which)
    tokenizer: Tokenizer
    # env.turns > 1: the executed multi-turn SFT episodes of the training tasks
    # (`multiturn_corpus.execute_episodes` records) and the episode task of every suite task.
    episodes: list[dict] = dataclasses.field(default_factory=list)
    episode_tasks: dict = dataclasses.field(default_factory=dict)


def heldout_scripts_per_task(config) -> int:
    """Scripts executed per held-out task (`data.heldout_scripts_per_task`; -1: as many as
    per training task). Held-out executions only measure the pretrained WM on unseen tasks
    (the WM pretraining report's `heldout`): no stage trains on them."""
    n = config.data.heldout_scripts_per_task
    return config.data.scripts_per_task if n == -1 else n


def prepare_data(config, data_dir: str | os.PathLike, progress: bool = True) -> Prepared:
    """Build (or reuse) the suite, execute the corpus resumably, train the tokenizer once
    (or, starting from a pretrained checkpoint, load the checkpoint's own)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if config.suite.dir:
        suite_dir = Path(config.suite.dir)
    else:
        suite_dir = data_dir / "suite"
        index = suite_dir / "suite.json"
        wanted = list(config.suite.tasks)
        have = [t["id"] for t in json.loads(index.read_text())] if index.exists() else None
        if have is not None and sorted(have) != sorted(wanted):
            raise ConfigError(
                "config.suite.tasks",
                f"{suite_dir} was built for tasks {sorted(have)}; use another data_dir",
            )
        if have is None:
            from wmrl.autoresearch.env.suite import build_suite

            build_suite(suite_dir, only=wanted, workers=config.suite.workers, seed=config.seed)
    _refuse_stale_suite(suite_dir, "config.suite.dir" if config.suite.dir else "config.data_dir")
    try:
        tasks = load_suite(suite_dir)
    except (OSError, ValueError) as e:
        raise ConfigError("config.suite.dir", f"cannot load the task suite: {e}") from e
    train = [t for t in tasks if t.split == "train"]
    heldout = [t for t in tasks if t.split == "heldout"]
    if not train or not heldout:
        raise ConfigError("config.suite", f"{suite_dir} needs train and heldout tasks")
    held = heldout_scripts_per_task(config)
    log = execute_corpus(
        suite_dir,
        data_dir / "trajectories",
        scripts_per_task=config.data.scripts_per_task,
        seed=config.seed,
        mistake_rate=config.data.mistake_rate,
        workers=config.suite.workers,
        progress=progress,
        executor_config=config.suite,
        heldout_scripts_per_task=held,
    )
    executions = corpus_records(log, config.data.scripts_per_task, held)
    episodes, episode_tasks = [], {}
    if config.env.turns > 1:
        episodes, episode_tasks = _episodes(config, data_dir, suite_dir, train + heldout, progress)
    if pretrained.enabled(config):
        tok = pretrained.load_tokenizer(config)
        return Prepared(suite_dir, train, heldout, executions, tok, episodes, episode_tasks)
    # Multi-turn tokenizers also see the history's text (observations, turn headers).
    suffix = f"_k{config.env.turns}" if config.env.turns > 1 else ""
    spm_path = data_dir / f"spm_p{PROMPT_FORMAT}_v{config.data.vocab_size}{suffix}.model"
    if not spm_path.exists():
        prompts = {t.id: prompt_text(t) for t in train}
        docs = list(prompts.values()) + [
            r["script"] for r in executions if r["task_id"] in prompts
        ]  # training tasks only: held-out tasks never shape the tokenizer
        docs += [prompt for prompt, _ in episode_documents(config, episodes, episode_tasks)]
        tmp = data_dir / "spm.tmp"
        Tokenizer.train(docs, tmp, vocab_size=config.data.vocab_size, code_pieces=True)
        os.replace(f"{tmp}.vocab", spm_path.with_suffix(".vocab"))
        os.replace(f"{tmp}.model", spm_path)
    tok = Tokenizer.load(spm_path)
    return Prepared(suite_dir, train, heldout, executions, tok, episodes, episode_tasks)


def _refuse_stale_suite(suite_dir: Path, field: str) -> None:
    """An older builder's built-in tasks are refused, not reused (`suite.stale_tasks`):
    their rows differ from this builder's, and before version 2 they were copies of data a
    sandboxed script can read, labels included."""
    from wmrl.autoresearch.env.suite import SUITE_VERSION, stale_tasks

    if not (suite_dir / "suite.json").is_file():
        return
    stale = stale_tasks(suite_dir)
    if stale:
        more = f" and {len(stale) - 3} more" if len(stale) > 3 else ""
        raise ConfigError(
            field,
            f"{suite_dir} holds built-in tasks written by an older suite builder "
            f"({', '.join(stale[:3])}{more}; this one writes version {SUITE_VERSION}): build "
            "the suite again in a new directory, with a new data_dir (the executed corpus "
            "there was made on the old tasks)",
        )


def _episodes(config, data_dir: Path, suite_dir: Path, tasks: list[Task], progress: bool):
    """The episode task of every suite task, and the executed multi-turn SFT episodes of the
    training tasks (`multiturn_corpus.execute_episodes`, resumable)."""
    from wmrl.autoresearch.env.episode import make_episode_task
    from wmrl.autoresearch.env.multiturn_corpus import execute_episodes, read_episodes
    from wmrl.autoresearch.env.task import TaskError

    root = data_dir / EPISODE_TASKS
    try:
        episode_tasks = {t.id: make_episode_task(t, root) for t in tasks}
    except TaskError as e:
        raise ConfigError("config.suite.tasks", f"env.turns > 1: {e}") from e
    log = execute_episodes(
        suite_dir, data_dir, task_root=root, episodes_per_task=config.env.sft_episodes_per_task,
        turns=config.env.turns, seed=config.seed, workers=config.suite.workers,
        progress=progress, executor_config=config.suite,
    )  # fmt: skip
    episodes = [r for r in read_episodes(log) if len(r["turns"]) == config.env.turns]
    return episodes, episode_tasks


def episode_documents(
    config, episodes: list[dict], episode_tasks: dict, fits=None, first_turns: bool = True
) -> list:
    """(prompt, script) pairs of every turn of the executed SFT episodes: turn t's prompt is
    the card plus the real history of turns < t (`wmrl.autoresearch.history`, the trainer's own
    prompt), its script the author's. `fits(text)`: the prompt budget (None: no limit).
    `first_turns` False: the revisions only (turns t > 1), in the same order."""
    from wmrl.autoresearch import history
    from wmrl.autoresearch.env.observation import Observation, render_observation

    fits = fits or (lambda text: True)
    out = []
    for rec in episodes:
        task = episode_tasks[rec["task_id"]]
        card = history.card_of(prompt_text(task))
        past = []
        for turn in rec["turns"]:
            if past or first_turns:
                text = history.turn_prompt(card, past, fits)
                out.append((pretrained.prompt(config, text), turn["script"]))
            obs = Observation.from_json(turn["observation"])
            past.append((turn["script"], render_observation(obs, task.metric_name)))
    return out


def sft_documents(config, tasks: list[Task], episode_tasks=None) -> list[tuple[str, str]]:
    """(prompt, script) pairs for the warm start: the executed corpus's scripts plus
    `data.sft_scripts_per_task` more authored ones per training task (text only: SFT needs
    no outcome), drawn with the same mistake rate so the warm-start policy errs as the
    author does and RL has something to fix. With `episode_tasks` (multi-turn) the prompts
    are the episode tasks' turn-1 prompts."""
    from wmrl.autoresearch.env import author
    from wmrl.autoresearch.env.corpus import task_seed

    out = []
    for t in tasks:
        prompt = task_prompt(config, episode_tasks[t.id] if episode_tasks else t)
        scripts = author.write_scripts(
            task_info(t),
            config.data.scripts_per_task + config.data.sft_scripts_per_task,
            task_seed(t.id, config.seed),
            config.data.mistake_rate,
        )  # the first scripts_per_task are exactly the executed corpus's
        out += [(prompt, source) for _, source in scripts]
    return out


def encode_prompts(tok: Tokenizer, texts: list[str], max_prompt_len: int) -> tuple:
    """Left-padded `[B, P]` prompt ids and mask; a prompt that does not fit is an error."""
    try:
        return tok.batch_encode(texts, max_len=max_prompt_len, add_bos=True)
    except ValueError as e:
        raise ConfigError("config.data.max_prompt_len", str(e)) from e


def encode_trajectories(
    tok: Tokenizer, prompts: list[str], scripts: list[str], max_prompt_len: int, max_new: int
) -> dict[str, np.ndarray]:
    """Rows in the shared layout. `fits[i]` is False where the script needed truncation."""
    ids, pmask = encode_prompts(tok, prompts, max_prompt_len)
    n = len(scripts)
    comp = np.zeros((n, max_new), np.int32)
    cmask = np.zeros((n, max_new), bool)
    fits = np.zeros(n, bool)
    for i, s in enumerate(scripts):
        body = tok.encode(s, add_eos=True)
        fits[i] = len(body) <= max_new
        body = body[:max_new]
        comp[i, : len(body)] = body
        cmask[i, : len(body)] = True
    return {
        "tokens": np.concatenate([ids, comp], axis=1),
        "input_mask": np.concatenate([pmask, cmask], axis=1),
        "loss_mask": np.concatenate([np.zeros_like(pmask), cmask], axis=1).astype(np.float32),
        "fits": fits,
    }


def executed_runtime(status: np.ndarray, runtime_s) -> np.ndarray:
    """[n] float32 runtimes (s) as WM targets: NaN where the script never ran (MALFORMED is
    refused before execution, UNGRADED is no outcome) or the runtime is not known."""
    rt = np.array([math.nan if v is None else v for v in runtime_s], np.float32)
    ran = (status != int(Status.MALFORMED)) & (status != int(Status.UNGRADED))
    return np.where(ran & np.isfinite(rt), rt, np.nan).astype(np.float32)


def reward_targets(records: list[dict]) -> dict[str, np.ndarray]:
    """WM targets: reward (NaN for ungraded), outcome class (-1 for ungraded) and runtime
    (`executed_runtime`; a TIMEOUT's is the limit it was stopped at, a lower bound)."""
    reward = np.array(
        [math.nan if r.get("reward") is None else r["reward"] for r in records], np.float32
    )
    status = np.array([r["status"] for r in records], np.int32)
    graded = status != int(Status.UNGRADED)
    return {
        "target": np.where(graded, reward, 0.0).astype(np.float32),
        "class_label": np.where(graded, status, -1).astype(np.int32),
        "valid": graded & ~np.isnan(reward),
        "runtime": executed_runtime(status, [r.get("runtime_s") for r in records]),
        "error_type": error_type_index(records, status),
        # The raw validation metric: only an episode task's execution measures one.
        "validation": np.array(
            [math.nan if r.get("validation") is None else r["validation"] for r in records],
            np.float32,
        ),
    }


def error_type_index(records: list[dict], status: np.ndarray) -> np.ndarray:
    """[n] int32 index into `observation.ERROR_TYPES` of each record's exception class: its
    `error_type` where recorded, else read from its `stderr_tail` (`error_type_of`); -1 for
    ungraded rows."""
    out = np.full(len(records), -1, np.int32)
    for i, r in enumerate(records):
        if status[i] == int(Status.UNGRADED):
            continue
        name = r.get("error_type") or error_type_of(r.get("stderr_tail", ""), Status(status[i]))
        out[i] = ERROR_TYPES.index(name)
    return out


def time_limit(task: Task, cap_s: float = 0.0) -> float:
    """The wall-clock limit a script of `task` runs under: the task's own, capped by
    `cap_s` (`suite.time_limit_s`; 0 = no cap), as the sandbox pool applies it."""
    return min(task.time_limit_s, cap_s) if cap_s else task.time_limit_s
