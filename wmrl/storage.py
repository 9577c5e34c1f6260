"""Where a run writes: a local folder, or any URL `etils.epath` supports (`gs://`, `s3://`,
`az://`, `hf://`).

Every file of a workdir goes through `etils.epath.Path` (the JSON and JSON-lines files, the
plots, TensorBoard's event files) or through Orbax (checkpoints; its array data go through
TensorStore's own GCS driver). A local path behaves exactly as a `pathlib.Path`. Object
stores differ from a file system in ways the writers account for: no append (see
`wmrl.jsonl.JsonlWriter`), no fsync, no atomic rename of a folder, no empty folders; an object
appears whole once its upload completes.

Client libraries: `gs://` needs `gcsfs` (epath's backend when TensorFlow is absent) and
`google-cloud-storage` (Orbax lists checkpoint steps with it): `requirements-gcs.txt`.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import time

from etils import epath

from wmrl.config_errors import ConfigError

CACHE_ENV = "WMRL_CACHE_DIR"
DEFAULT_CACHE = "~/.cache/wmrl"


def workdir_path(path: str | os.PathLike) -> epath.Path:
    return epath.Path(path)


def is_local(path: str | os.PathLike) -> bool:
    """True for a local path, False for a URL (`scheme://...`)."""
    return "://" not in os.fspath(path)


def absolute(path: epath.Path) -> epath.Path:
    """`path.absolute()` for local paths; a URL is already absolute (and epath's `absolute()`
    would prefix it with the current directory)."""
    return path.absolute() if is_local(path) else path


def require_local(value: str, field: str) -> None:
    """A config field that names a folder subprocesses read must be a local path."""
    if value and not is_local(value):
        raise ConfigError(
            f"config.{field}",
            f"{value!r} is not a local directory: the data stage runs sandboxed subprocesses "
            "that read local files. Give a local path, or leave it empty (with a remote "
            f"--workdir the data stage then goes to the local cache ${CACHE_ENV}, default "
            f"{DEFAULT_CACHE})",
        )


def local_cache_dir(workdir: str | os.PathLike) -> pathlib.Path:
    """The local folder that holds a remote workdir's local-only files:
    `$WMRL_CACHE_DIR/workdirs/<scheme>/<bucket>/<path>` (default `~/.cache/wmrl`)."""
    scheme, rest = os.fspath(workdir).split("://", 1)
    root = pathlib.Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
    return root / "workdirs" / scheme / rest.strip("/")


def check_backend(workdir: epath.Path, orbax: bool = False) -> None:
    """Fail before the run (ValueError naming the fix) when a remote workdir's client
    libraries are missing, instead of at the first write or checkpoint."""
    if is_local(workdir):
        return
    hint = "for gs://: pip install -r requirements-gcs.txt"
    try:
        workdir.exists()
    except ImportError as e:
        raise ValueError(f"cannot reach --workdir={workdir}: {e} ({hint})") from e
    if orbax and os.fspath(workdir).startswith("gs://"):
        try:
            import google.cloud.storage  # noqa: F401 - Orbax lists checkpoint steps with it
        except ImportError as e:
            raise ValueError(
                f"Orbax checkpoints in --workdir={workdir} need google-cloud-storage ({hint})"
            ) from e


def move_tree(src: epath.Path, dst: epath.Path) -> None:
    """Move a folder. Local: `shutil.move`. Remote: copy every object, then delete the
    source (object stores have no folder rename)."""
    if is_local(src) and is_local(dst):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(os.fspath(src), os.fspath(dst))
        return
    for f in _files(src):
        f.copy(dst / os.path.relpath(os.fspath(f), os.fspath(src)), overwrite=True)
    src.rmtree()


def write_json(path: str | os.PathLike, obj) -> None:
    """`obj` as indented JSON. Local: atomically (a temp file renamed over `path`). Remote: one
    object upload (an object appears whole once its upload completes)."""
    text = json.dumps(obj, indent=2) + "\n"
    path = epath.Path(path)
    if not is_local(path):
        path.write_text(text)
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _files(root: epath.Path):
    """Every file under `root`, as full paths (epath's `walk` yields a remote root without
    its scheme, so it is not used here)."""
    for child in root.iterdir():
        if child.is_dir():
            yield from _files(child)
        else:
            yield child


def save_figure(fig, path: str | os.PathLike, dpi: int) -> epath.Path:
    """Write a matplotlib figure as PNG through a bytes buffer (any epath URL)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    path = epath.Path(path)
    path.write_bytes(buf.getvalue())
    return path


class _EventFile:
    """A TensorBoard event file on an epath URL: records accumulate in memory and every flush
    uploads the whole file (tensorboardX's own gs:// writer does the same, through
    google-cloud-storage); an upload replaces the object whole, never a torn file."""

    def __init__(self, path: str):
        self._path = epath.Path(path)
        self._buf = io.BytesIO()

    def write(self, data: bytes) -> None:
        self._buf.write(data)

    def flush(self) -> None:
        self._path.write_bytes(self._buf.getvalue())

    def close(self) -> None:
        self.flush()


class _EventFiles:
    """tensorboardX writer factory (`record_writer.register_writer_factory`)."""

    def open(self, path: str) -> _EventFile:
        return _EventFile(path)

    def directory_check(self, path: str) -> None:
        pass  # object stores have no folders to create


class TensorBoardWriter:
    """TensorBoard scalars written as they come: when `add_scalar` returns, its event is in
    the event file's buffer, so `flush` puts every scalar added so far on disk (or, on a
    remote workdir, uploads it). tensorboardX's `SummaryWriter` hands events to a background
    thread whose queue its `flush` does not wait for: a run killed after a flush could lose
    the scalars of steps its checkpoint has seen.

    One event file per writer (named by the second it opens, as TensorBoard's are);
    `purge_step`: TensorBoard hides what earlier event files of the folder logged at steps >=
    it (a resumed run writes those steps again)."""

    def __init__(self, logdir: str | os.PathLike, purge_step: int | None = None):
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.record_writer import directory_check

        self._event = Event
        logdir = os.fspath(logdir)
        directory_check(logdir)
        self._file = EventsWriter(os.path.join(logdir, "events"))
        if purge_step is not None:
            self._file.write_event(Event(step=purge_step, file_version="brain.Event:2"))
            start = SessionLog(status=SessionLog.START)
            self._file.write_event(Event(step=purge_step, session_log=start))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.summary import scalar

        event = self._event(wall_time=time.time(), step=int(step), summary=scalar(tag, value))
        self._file.write_event(event)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def tensorboard_writer(logdir: epath.Path, purge_step: int | None = None) -> TensorBoardWriter:
    """A `TensorBoardWriter` for `logdir`; a remote one writes through epath (this registers
    our writer for its URL scheme in tensorboardX, for the whole process)."""
    from tensorboardX import record_writer

    if not is_local(logdir):
        record_writer.register_writer_factory(os.fspath(logdir).split("://")[0], _EventFiles())
    return TensorBoardWriter(logdir, purge_step=purge_step)
