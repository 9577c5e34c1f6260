"""wmrl: World Model RL in JAX."""

import os as _os
import stat as _stat
import sys as _sys

__version__ = "0.1.0"


def _drop_shared_import_dirs() -> None:
    """Remove from ``sys.path`` the directories every user can write, before this package
    imports anything: ``python -m wmrl...`` started in ``/tmp`` puts ``/tmp`` first on it,
    and a module planted there (a sandboxed script may write ``/tmp``) would run as the user
    who started the command, root included. Uses only modules loaded at interpreter start-up.
    ``python -P`` (or ``PYTHONSAFEPATH=1``) avoids the entry in the first place."""
    for entry in list(_sys.path):
        path = entry or _os.getcwd()
        try:
            info = _os.stat(path)
        except OSError:
            continue
        if _stat.S_ISDIR(info.st_mode) and info.st_mode & _stat.S_IWOTH:
            _sys.path.remove(entry)
            print(
                f"wmrl: not importing modules from {path}: every user can write it",
                file=_sys.stderr,
            )


_drop_shared_import_dirs()
