"""Execute one script on one task and print one JSON object.

    python -m wmrl.autoresearch.env.run --task=DIR --script=FILE [--isolation=auto]

Fields: status, status_id, reward, score, percentile, runtime_s, stdout_tail,
stderr_tail, isolation (the level that was active), detail, attempts, and on an imported
competition (docs/competitions.md) benchmark: its benchmark's verdict (medal, position score).
"""

from __future__ import annotations

import json
import math
import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS


def _define_flags() -> None:
    """Flags are defined only when run as a program, so modules import side-effect free."""
    flags.DEFINE_string("task", None, "task directory")
    flags.DEFINE_string("script", None, "Python script to execute")
    flags.DEFINE_enum("isolation", "auto", ["auto", "namespaces", "rlimits"], "isolation level")
    flags.DEFINE_bool("prefork", True, "fork from the pre-imported template (fast start-up)")


def main(argv) -> None:
    del argv
    from wmrl.autoresearch.env.pool import SandboxPool, SandboxStartupError
    from wmrl.autoresearch.env.task import TaskError, load_task

    if not FLAGS.task or not FLAGS.script:
        raise app.UsageError("--task and --script are required")
    if not os.path.isfile(FLAGS.script):
        raise app.UsageError(f"script {FLAGS.script} does not exist")
    try:
        task = load_task(FLAGS.task)
    except TaskError as e:
        raise app.UsageError(str(e)) from e
    with open(FLAGS.script, "rb") as f:
        source = f.read()
    try:
        pool = SandboxPool(num_workers=1, isolation=FLAGS.isolation, prefork=FLAGS.prefork)
    except (SandboxStartupError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    with pool:
        result = pool.run(task, source).to_json()
    if isinstance(result["reward"], float) and math.isnan(result["reward"]):
        result["reward"] = None  # JSON has no NaN; UNGRADED is masked, not scored
    print(json.dumps(result))


if __name__ == "__main__":
    _define_flags()
    app.run(main)
