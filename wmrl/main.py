"""Entry point: `python -m wmrl.main --config=configs/<name>.py --workdir=DIR`.

Kept short on purpose: parse flags, validate the config, join a multi-process run when one is
detected (`wmrl.distributed`), prepare the workdir, hand over to the experiment's library function
(which Colab can import and call directly). The workdir is a local folder or a URL such as
`gs://BUCKET/PATH` (`wmrl.storage`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from absl import app, flags, logging
from etils import epath
from ml_collections import config_flags

from wmrl import distributed, storage
from wmrl.config_errors import ConfigError
from wmrl.experiment import renamed

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.")
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Directory (or gs://BUCKET/PATH) for metrics, plots and checkpoints."
)
flags.mark_flags_as_required(["config", "workdir"])
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-process: HOST:PORT of process 0 (with the next two)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process: this process's index.")

EXPERIMENTS = ("bandit", "autoresearch", "embodied")


def validate(config) -> None:
    experiment = config.get("experiment")
    if experiment not in EXPERIMENTS:
        raise ConfigError("config.experiment", f"unknown experiment {experiment!r}")
    if experiment == "bandit":
        from wmrl.bandits.config import validate_bandit_config

        validate_bandit_config(config)
    elif experiment == "autoresearch":
        from wmrl.autoresearch.config import validate_autoresearch_config

        validate_autoresearch_config(config)
    elif experiment == "embodied":
        from wmrl.embodied.config import validate_embodied_config

        validate_embodied_config(config)


def check_fresh_workdir(workdir: epath.Path) -> None:
    """Refuse to overwrite a finished run (checked by every process, so all of them stop)."""
    if (workdir / "summary.json").exists():
        raise FileExistsError(
            f"{workdir} already holds a finished run (summary.json exists); "
            "choose a new --workdir or delete that one"
        )


def check_writable_workdir(workdir: epath.Path) -> None:
    """A local workdir must be a directory we can write in, or one we can create: a file in
    its place, or a read-only file system, is refused here in one line instead of failing at
    the first write. Nothing is created (URLs are checked by `storage.check_backend`)."""
    if not storage.is_local(workdir):
        return
    path = Path(os.fspath(workdir)).absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be made: {existing} is a file"
        raise ConfigError("--workdir", f"{path} {what}, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            "--workdir",
            f"{path} cannot be written: {existing} is read-only (a read-only file system or "
            "no write permission)",
        )


def prepare_workdir(workdir: epath.Path, config) -> None:
    """Write the resolved config (process 0 only)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(config.to_json_best_effort(indent=2) + "\n")


def use_all_cpu_cores() -> None:
    """Expose one XLA CPU device per core (before jax is imported) so independent bandit seeds
    run in parallel; it changes nothing on accelerators, whose devices are unaffected."""
    flags_now = os.environ.get("XLA_FLAGS", "")
    if "jax" not in sys.modules and "host_platform_device_count" not in flags_now:
        n = os.cpu_count() or 1
        os.environ["XLA_FLAGS"] = f"{flags_now} --xla_force_host_platform_device_count={n}".strip()


def check_run(config, workdir: epath.Path, **cluster_flags):
    """Everything checked before a run writes or allocates anything: the config (its
    experiment's typed schema), the cluster (`cluster_flags`: `distributed.detect_cluster`'s
    arguments), the workdir (writable, not a finished run, not a run of another config). A
    problem exits with status 2 and one line naming it; returns the cluster."""
    try:
        validate(config)
        cluster = distributed.detect_cluster(**cluster_flags)
        storage.check_backend(workdir, orbax=config.experiment == "autoresearch")
        check_fresh_workdir(workdir)
        check_writable_workdir(workdir)
        if config.experiment == "autoresearch":
            from wmrl.autoresearch.experiment import check_resumable

            check_resumable(config, workdir)  # before config.json is rewritten
        if config.experiment == "embodied":
            from wmrl.embodied.experiment import check_resumable as check_embodied_resumable

            if not storage.is_local(workdir):
                raise ConfigError("workdir", "embodied runs need a local folder, got a URL")
            check_embodied_resumable(config, workdir)
    except (ConfigError, FileExistsError, ValueError) as e:
        logging.error("%s", e)
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return cluster


def main(argv: list[str]) -> None:
    del argv
    config = _CONFIG.value
    workdir = storage.workdir_path(_WORKDIR.value)
    cluster = check_run(
        config,
        workdir,
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
    )
    distributed.maybe_initialize(cluster)
    if distributed.writes_outputs(cluster):
        try:
            prepare_workdir(workdir, config)
        except OSError as e:  # what the check could not see (e.g. a full disk)
            print(f"error: --workdir: cannot write {workdir}: {e}", file=sys.stderr)
            sys.exit(2)
    if config.experiment == "bandit":
        use_all_cpu_cores()
        from wmrl.bandits.experiment import run_suite

        # Every process computes the suite; only the output owner writes it.
        summary = run_suite(config, workdir if distributed.writes_outputs(cluster) else None)
        table = {v: s["final_suboptimality"] for v, s in summary["variants"].items()}
        print(json.dumps({"workdir": str(workdir), "final_suboptimality": table}, indent=2))
    elif config.experiment == "autoresearch":
        from wmrl.autoresearch.anchors import JournalError
        from wmrl.autoresearch.env.pool import SandboxStartupError
        from wmrl.autoresearch.experiment import run

        try:
            summary = run(config, workdir, write_outputs=distributed.writes_outputs(cluster))
        # the host cannot run the sandbox safely, or a stage's journal was tampered with
        except (SandboxStartupError, JournalError) as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        keys = ("mode", "warmstart_heldout_reward", "final_heldout_reward", "wall_time_s",
                "time_to_target_s", "real_executions", "wm_calls")  # fmt: skip
        print(json.dumps({"workdir": str(workdir), **{k: summary[k] for k in keys}}, indent=2))
    elif config.experiment == "embodied":
        from wmrl.embodied.experiment import run as run_embodied

        summary = run_embodied(config, workdir, progress=True)
        keys = ("mode", "observations", "warmstart_heldout_success", "final_heldout_success",
                "real_executions", "wm_episodes", "real_executions_to_target")  # fmt: skip
        print(json.dumps({"workdir": str(workdir), **{k: summary[k] for k in keys}}, indent=2))


if __name__ == "__main__":
    app.run(main, flags_parser=renamed.parse_flags)
