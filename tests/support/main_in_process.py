"""`python -m wmrl.main`'s checks in this process: the command line's `--config` and
`--config.x.y=` overrides parsed by ml_collections as the entry point parses them, then
`wmrl.main.check_run` (the same validation, cluster and workdir checks, and exit status 2 with
one line on stderr). A config error needs no subprocess."""

from __future__ import annotations

import contextlib
import io

from absl import flags
from ml_collections import config_flags

from wmrl import main as entry
from wmrl import storage
from wmrl.experiment import renamed


def config_from_command_line(config_file, *overrides):
    """The ConfigDict `--config=config_file` and `overrides` make (fresh flags, no globals)."""
    argv = ["wmrl.main", f"--config={config_file}", *overrides]
    renamed.refuse_renamed_overrides(argv)
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, sys_argv=argv)
    fv(argv)
    return fv.config


def check_in_process(config_file, workdir, *overrides) -> tuple[int, str]:
    """(exit status, stderr) of the entry point's checks: 0 when the run would start."""
    config = config_from_command_line(config_file, *overrides)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            entry.check_run(config, storage.workdir_path(str(workdir)))
        except SystemExit as e:
            return e.code, err.getvalue()
    return 0, err.getvalue()
