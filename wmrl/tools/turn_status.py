"""Where a multi-turn policy's turns end: the per-turn status table of the warm start.

    python -m wmrl.tools.turn_status --config=configs/autoresearch_multiturn.py --workdir=DIR \\
        [--episodes_per_task=8] [--seed=0] [--config.FIELD=VALUE ...]

Builds (or loads) the config's stages under DIR as a run would (the data stage in
`config.data_dir` or DIR/data, the warm start and WM in `config.init_dir` or DIR/init), then
samples `episodes_per_task` K-turn episodes of the warm-started policy on every suite task
(training and held-out), as the held-out evaluation does (its sampling settings, the
evaluation key of step 0 under RL seed `--seed`), and executes every turn for real on the
episode tasks, each later turn prompted with the real history
(`wmrl.autoresearch.multiturn.MultiTurnTrainer.turn_prompt`). Nothing trains.

Prints, per turn: the episodes, how many the static check decides
(`grader.static_outcome`), MALFORMED, NameError (the executed exception), RUNTIME_ERROR,
VALID, the scripts cut by `data.max_new_tokens` (no EOS) and the prompts cut by
`data.max_prompt_len` (`history.TRUNCATED`); and of the later turns the static check flags,
why: a line that is in neither the prompt nor any authored script of the task (numbers
ignored: a splice of the earlier script), a class the earlier script never imported, an
import line of the earlier script dropped. Writes DIR/turn_status.json: one list of turn
records per episode (`turn`, `task`, `split`, `status`, `error_type`, `static`,
`static_why`, `undefined`, `tokens`, `hit_max_new`, `prompt_truncated`, `script`, `prompt`).
"""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
from absl import app, flags
from ml_collections import config_flags

ROOT = Path(__file__).resolve().parents[2]


def _numbers_out(line: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", line.strip())


def episodes(config, workdir: str | Path, per_task: int, seed: int = 0) -> list[list[dict]]:
    """`per_task` episodes of every suite task, every turn executed: [episode][turn] records
    (module docstring)."""
    from wmrl.autoresearch import evaluation, history
    from wmrl.autoresearch.env.grader import Status, check_script, static_outcome, undefined_names
    from wmrl.autoresearch.env.pool import SandboxPool
    from wmrl.autoresearch.experiment import prepare_stages
    from wmrl.autoresearch.multiturn import MultiTurnTrainer, observations_from_arrays
    from wmrl.experiment import config as xconfig

    config = xconfig.set_fields(config, {"rl.eval_samples": per_task, "rl.seed": seed})
    if config.env.turns < 2:
        raise app.UsageError("turn_status needs a multi-turn config (env.turns > 1)")
    workdir = Path(workdir)
    s = prepare_stages(config, workdir, progress=False)
    out_dir = workdir / "turn_status"
    out_dir.mkdir(parents=True, exist_ok=True)
    pool = SandboxPool(config.suite.workers, time_limit_cap_s=config.suite.time_limit_s)
    trainer = MultiTurnTrainer(config, s.prepared, s.policy, s.wm, pool, out_dir)
    try:
        st = trainer.initial_state(s.policy_params, s.wm_params)
        tasks = s.prepared.train_tasks + s.prepared.heldout_tasks
        n, P = len(tasks) * per_task, trainer.P
        row_tasks = [t for t in tasks for _ in range(per_task)]
        key = evaluation.eval_key(seed, 0)
        past = [[] for _ in range(n)]
        recs = [[] for _ in range(n)]
        for t in range(trainer.K):
            prompts = [
                trainer.turn_prompt(task, p) for task, p in zip(row_tasks, past, strict=True)
            ]
            rows, scripts = trainer._turn(
                st.policy.params, t, tasks, row_tasks, past, trainer.eval_sc, key
            )
            ex = trainer._submit_turns(
                trainer.eval_journal, 0, t * n + np.arange(n), row_tasks, scripts, "eval"
            )
            got, _ = trainer._collect_turns(trainer.eval_journal, ex)
            obs = observations_from_arrays(got)
            done = rows["input_mask"][:, P:]
            for i, script in enumerate(scripts):
                verdict = static_outcome(script.encode())
                compiles = check_script(script.encode()) is None
                recs[i].append({
                    "turn": t + 1, "task": row_tasks[i].id, "split": row_tasks[i].split,
                    "status": Status(int(got["status"][i])).name,
                    "error_type": obs[i].error_type,
                    "static": None if verdict is None else verdict[0].name,
                    "static_why": None if verdict is None else verdict[1],
                    "undefined": (undefined_names(script) or []) if compiles else None,
                    "tokens": int(done[i].sum()), "hit_max_new": bool(done[i].all()),
                    "prompt_truncated": bool(t and history.TRUNCATED in prompts[i]),
                    "script": script, "prompt": prompts[i] if t else None,
                })  # fmt: skip
                past[i].append((script, obs[i]))
    finally:
        trainer.journal.close()
        trainer.eval_journal.close()
        pool.close()
    return recs


def authored_lines(config, prepared) -> dict[str, set[str]]:
    """Per task id, every line (numbers ignored) of its authored scripts: the SFT corpus and
    the executed episodes' turns."""
    from wmrl.autoresearch.env import author
    from wmrl.autoresearch.env.corpus import task_seed
    from wmrl.autoresearch.env.make_task import task_info

    known = collections.defaultdict(set)
    n = config.data.scripts_per_task + config.data.sft_scripts_per_task
    for task in prepared.train_tasks + prepared.heldout_tasks:
        scripts = author.write_scripts(
            task_info(task), n, task_seed(task.id, config.seed), config.data.mistake_rate
        )
        known[task.id] |= {_numbers_out(line) for _, src in scripts for line in src.splitlines()}
    for rec in prepared.episodes:
        for turn in rec["turns"]:
            known[rec["task_id"]] |= {_numbers_out(line) for line in turn["script"].splitlines()}
    return known


def why_broken(turn: dict, earlier: str, known: set[str]) -> str | None:
    """Why a later turn the static check flags is broken: `splice` (a line in neither its
    prompt nor any authored script of the task, numbers ignored), `new class` (it reads a
    name the earlier script never mentions), `dropped import` (an import line of the earlier
    script is gone), else `other`; None when the static check does not flag it."""
    if turn["static"] is None:
        return None
    context = known | {_numbers_out(line) for line in (turn["prompt"] or "").splitlines()}
    lines = [line for line in turn["script"].splitlines() if line.strip()]
    if any(_numbers_out(line) not in context for line in lines):
        return "splice"
    names = turn["undefined"] or []
    if any(not re.search(rf"\b{re.escape(name)}\b", earlier) for name in names):
        return "new class"
    imports = [line for line in earlier.splitlines() if line.startswith(("from ", "import "))]
    if any(line not in turn["script"] for line in imports):
        return "dropped import"
    return "other"


def table(recs: list[list[dict]], known: dict[str, set[str]] | None = None) -> str:
    """The per-turn table (module docstring) as Markdown."""
    head = [
        "| turn | episodes | static check decides | MALFORMED | NameError | RUNTIME_ERROR "
        "| VALID | cut at max_new_tokens | prompt cut |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines = list(head)
    for t in range(len(recs[0])):
        turns = [e[t] for e in recs]
        status = collections.Counter(r["status"] for r in turns)
        lines.append(
            f"| {t + 1} | {len(turns)} | {sum(r['static'] is not None for r in turns)} "
            f"| {status['MALFORMED']} | {sum(r['error_type'] == 'NameError' for r in turns)} "
            f"| {status['RUNTIME_ERROR']} | {status['VALID']} "
            f"| {sum(r['hit_max_new'] for r in turns)} "
            f"| {sum(r['prompt_truncated'] for r in turns)} |"
        )
    if known is not None:
        for t in range(1, len(recs[0])):
            why = collections.Counter(
                why_broken(e[t], e[t - 1]["script"], known[e[t]["task"]]) for e in recs
            )
            why.pop(None, None)
            lines.append(
                f"\nturn {t + 1}, flagged by the static check: {dict(sorted(why.items()))}"
            )
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    from wmrl.autoresearch import data as rldata
    from wmrl.autoresearch.experiment import data_dir

    config, workdir = FLAGS.config, Path(FLAGS.workdir)
    recs = episodes(config, workdir, FLAGS.episodes_per_task, FLAGS.seed)
    prepared = rldata.prepare_data(config, data_dir(config, workdir), progress=False)
    print(table(recs, authored_lines(config, prepared)))
    (workdir / "turn_status.json").write_text(json.dumps(recs))


FLAGS = flags.FLAGS

if __name__ == "__main__":
    config_flags.DEFINE_config_file(
        "config", str(ROOT / "configs" / "autoresearch_multiturn.py"), "Multi-turn config file."
    )
    flags.DEFINE_string("workdir", None, "Where the stages and the executions go.", required=True)
    flags.DEFINE_integer("episodes_per_task", 8, "Episodes sampled per suite task.")
    flags.DEFINE_integer("seed", 0, "The RL seed whose step-0 evaluation key samples them.")
    app.run(main)
