"""Names that changed, in one place: config fields, and keys of the records runs write.

AutoResearch and embodied once had their own names for some things both have; each now has
one. Old run directories keep working:

* `FIELDS`, config fields (old dotted name -> new). A saved config (a run's config.json, a
  stage's fingerprint) compares under the new name (`ConfigHistory.renamed`), so a run saved
  with `rl.tasks_per_step: 4` resumes under `rl.groups_per_step=4`; the old name in a config
  file or on the command line is a `ConfigError` naming both
  (`wmrl.experiment.config.renamed_field`).
* `KEYS`, keys of what embodied runs write (metrics.jsonl, summary.json, a stage's done.json;
  an embodied execution is one simulator episode), old -> new. `upgrade_keys` reads a record
  written before under today's keys; every reader of a finished or resumed run's records
  goes through it.
"""

from __future__ import annotations

from collections.abc import Mapping

# B groups of G samples per step: AutoResearch's `rl.tasks_per_step` (embodied's name won).
FIELDS: Mapping[str, str] = {"rl.tasks_per_step": "rl.groups_per_step"}

KEYS: Mapping[str, str] = {
    # the cost counter: real executions (AutoResearch's name; an embodied execution is one
    # simulator episode), and the embodied keys derived from it
    "real_episodes": "real_executions",
    "real_episodes_to_target": "real_executions_to_target",
    "stage_real_episodes": "stage_real_executions",
    "eval_real_episodes": "eval_real_executions",
    # the correction's residual before debiasing (the core's name)
    "bias_before": "residual_before",
    "bias_after": "residual_after",
}


def upgrade_keys(record):
    """`record` (a dict, list or value from JSON) with every old key of `KEYS`, at any depth,
    under its new name; a record of today's names is returned equal. Where a record has both
    names (never written so), today's wins."""
    if isinstance(record, Mapping):
        return {KEYS.get(k, k): upgrade_keys(v) for k, v in record.items()
                if not (k in KEYS and KEYS[k] in record)}  # fmt: skip
    if isinstance(record, list):
        return [upgrade_keys(v) for v in record]
    return record


def refuse_renamed_overrides(argv: list[str]) -> None:
    """A `--config.x.y=` override of a field under its old name (`wmrl.experiment.renamed`)
    is a ConfigError naming both (ml_collections would stop on it with a bare
    AttributeError)."""
    from wmrl.experiment.config import renamed_field

    for arg in argv[1:]:
        if arg == "--":
            break
        name = arg.partition("=")[0].removeprefix("--config.")
        if arg.startswith("--config.") and name in FIELDS:
            raise renamed_field(name, FIELDS[name])


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, after `refuse_renamed_overrides` (exit status 2, one line): the
    `flags_parser` of every entry point that takes `--config` (`app.run(main,
    flags_parser=parse_flags)`)."""
    import sys

    from absl import app

    from wmrl.config_errors import ConfigError

    try:
        refuse_renamed_overrides(argv)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return app.parse_flags_with_usage(argv)
