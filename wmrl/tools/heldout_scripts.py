"""The scripts of a finished run's held-out evaluation, sampled again from its checkpoint.

    python -m wmrl.tools.heldout_scripts --workdir=RUN [--step=N] [--out=FILE]

A run's `heldout.jsonl` journals every held-out execution (status, reward, error type) but
only a hash of each script. To read what the policy wrote, this samples the evaluation of
step N (default: the latest checkpoint) again: the policy of the step's checkpoint, the
evaluation's own key (`wmrl.autoresearch.evaluation.eval_key`) and sampling settings, on the
run's own stages. Each script is checked against the journal's hash, so a mismatch (another
machine's or library's numerics) is reported, never hidden. Nothing is executed: the
journal's outcome is joined to each matching script, and the static check
(`wmrl.autoresearch.env.grader.static_outcome`) says which failures it would have flagged.

Writes FILE (default `<workdir>/heldout_scripts.<step>.jsonl`), one row per script:
`row`, `task_id`, `sha`, `journalled` (the journal has that row of the step),
`matches_journal`, `status`, `reward`, `error_type` (the journal's;
null where the hash differs), `static` (the status name the static check gives, or null) and
`static_reason`, `script`. Prints the matches and a table of outcome against static verdict.
Single-turn runs only; the run's config is read from its `config.json` over `--config`
(the config file it was started from; default the tiny config) and checked to be the same.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from absl import app, flags

ROOT = Path(__file__).resolve().parents[2]


def run_config(config_file: str | Path, workdir: str | Path):
    """The config the run in `workdir` ran with: `config_file`'s, with every field its
    `config.json` saved, checked the way a resume is (`check_resumable`)."""
    from wmrl.autoresearch import config as rlconfig
    from wmrl.autoresearch.experiment import check_resumable
    from wmrl.config_errors import ConfigError
    from wmrl.experiment import config as xconfig

    saved_path = Path(workdir) / "config.json"
    if not saved_path.exists():
        raise ConfigError("workdir", f"{workdir} holds no run (no config.json)")
    config = xconfig.load_config_file(config_file)
    current = xconfig.flatten(xconfig.plain(config))
    saved = rlconfig.HISTORY.upgrade(xconfig.flatten(json.loads(saved_path.read_text())), current)
    items = {}
    for k, v in saved.items():
        if k not in current:
            raise ConfigError("config", f"{saved_path} sets {k}, which {config_file} does not have")
        now = xconfig.get_field(config, k)
        items[k] = tuple(v) if isinstance(now, tuple) and isinstance(v, list) else v
    xconfig.set_fields(config, items)
    check_resumable(config, workdir)
    return config


def heldout_scripts(config, workdir: str | Path, step: int | None = None) -> tuple[int, list[dict]]:
    """(step, rows) of the held-out evaluation at `step` (None: the latest checkpoint), sampled
    again as described in the module doc."""
    from wmrl.autoresearch import anchors, evaluation, model_setup, stages
    from wmrl.autoresearch import config as rlconfig
    from wmrl.autoresearch import data as rldata
    from wmrl.autoresearch.checkpoint import Checkpointer
    from wmrl.autoresearch.env.grader import static_outcome
    from wmrl.autoresearch.experiment import init_dir, prepare_stages
    from wmrl.config_errors import ConfigError
    from wmrl.experiment.checkpoint import quiet_orbax
    from wmrl.jsonl import read_jsonl

    workdir = Path(workdir)
    if config.env.turns > 1:
        raise ConfigError("env.turns", f"is {config.env.turns}: single-turn runs only")
    if not stages.stages_done(config, init_dir(config, workdir)):
        raise ConfigError(
            "init_dir", f"the run's stages are not all in {init_dir(config, workdir)} "
            "(this tool loads them, it never builds them)"
        )  # fmt: skip
    quiet_orbax()
    ckpt = Checkpointer(workdir, config.rl.keep_checkpoints)
    try:
        kept = ckpt.run.all_steps()
        step = kept[-1] if step is None and kept else step
        if step not in kept:
            raise ConfigError("step", f"{step}: no checkpoint of it in {workdir} (kept: {kept})")
        state, _ = ckpt.read_raw(step)
    finally:
        ckpt.close()
    s = prepare_stages(config, workdir, progress=False)
    tc = rlconfig.trainer_config(config)
    tasks, k = s.prepared.heldout_tasks, tc.eval_samples
    sc = evaluation.rl_sampling(config, s.prepared.tokenizer, k)
    prompts = [rldata.task_prompt(config, t) for t in tasks]
    _, scripts = evaluation.generate_rows(
        s.policy.graphdef, state["policy"]["params"], s.prepared.tokenizer, prompts,
        tc.prompt_len, sc, evaluation.eval_key(tc.seed, step), model_setup.seq_len(config),
    )  # fmt: skip
    path = workdir / "heldout.jsonl"
    journal = read_jsonl(path) if path.exists() else []
    done = {r["row"]: r for r in journal if r["step"] == step}
    rows = []
    for i, script in enumerate(scripts):
        sha = anchors.script_sha(script)
        rec = done.get(i)
        match = rec is not None and rec["sha"] == sha
        verdict = static_outcome(script.encode("utf-8", "surrogatepass"), names=True)
        rows.append({
            "row": i, "task_id": tasks[i // k].id, "sha": sha, "journalled": rec is not None,
            "matches_journal": match,
            **{f: rec[f] if match else None for f in ("status", "reward", "error_type")},
            "static": None if verdict is None else verdict[0].name,
            "static_reason": None if verdict is None else verdict[1],
            "script": script,
        })  # fmt: skip
    return step, rows


def report(step: int, rows: list[dict]) -> str:
    """Matches, then outcome (the journal's status name, error type for runtime errors)
    against the static verdict, most common first."""
    from wmrl.autoresearch.env.grader import Status

    matched = [r for r in rows if r["matches_journal"]]
    lines = [f"step {step}: {len(matched)} of {len(rows)} scripts match the journal's hashes"]

    def outcome(r: dict) -> str:
        error = r["error_type"] not in (None, "none")
        return Status(r["status"]).name + (f" ({r['error_type']})" if error else "")

    table = Counter((outcome(r), r["static"] or "-") for r in matched)
    if table:
        width = max(len(o) for o, _ in table)
        lines.append(f"{'outcome'.ljust(width)}  {'static check':<14} scripts")
        lines += [f"{o.ljust(width)}  {v:<14} {n}" for (o, v), n in table.most_common()]
    unmatched = len(rows) - len(matched)
    if unmatched == len(rows) and not any(r["journalled"] for r in rows):
        lines.append(f"no held-out evaluation of step {step} in the journal (outcomes null)")
    elif unmatched:
        lines.append(f"{unmatched} scripts differ from the journal (outcomes left null)")
    return "\n".join(lines)


def main(argv) -> None:
    del argv
    f = flags.FLAGS
    config = run_config(f.config, f.workdir)
    step, rows = heldout_scripts(config, f.workdir, f.step)
    out = Path(f.out or Path(f.workdir) / f"heldout_scripts.{step}.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(report(step, rows))
    print(f"wrote {out}")


if __name__ == "__main__":
    flags.DEFINE_string("workdir", None, "A finished or checkpointed single-turn run.")
    flags.DEFINE_integer("step", None, "The evaluation's step (default: the latest checkpoint).")
    flags.DEFINE_string("out", None, "Output (default: <workdir>/heldout_scripts.<step>.jsonl).")
    flags.DEFINE_string(
        "config", str(ROOT / "configs" / "autoresearch_tiny.py"), "The run's config file."
    )
    flags.mark_flag_as_required("workdir")
    sys.exit(app.run(main))
