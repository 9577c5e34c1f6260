"""JSON-lines files: local ones appended as records come (a killed process may cut the last
line), remote ones (object stores) rewritten whole; see `JsonlWriter`."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

from etils import epath

from wmrl.storage import is_local


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every complete record of `path` ([] if it does not exist); a torn last line is skipped."""
    path = epath.Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return out


def drop_torn_tail(path: str | os.PathLike) -> None:
    """Cut a local file's last line if a kill left it half-written (no final newline), so
    that the next append starts a line of its own instead of being glued to the torn one
    (and lost with it)."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep != len(data):
            f.truncate(keep)


class JsonlWriter:
    """Appends records to a JSON-lines file, locally or on an object store.

    Local path: each `write` appends its records and flushes them to the OS (and fsyncs
    them with `fsync=True`) before returning; a kill may cut the last line, which
    `read_jsonl` skips and the writer cuts off before its first append.

    Remote URL (`gs://...`): object stores cannot append (an object is written whole) nor
    fsync, so the writer keeps the file's records in memory (the existing ones are read back
    first) and `flush` uploads the whole file again. The upload replaces the object
    atomically: a reader sees the file as of the last flush, never a torn line. Records
    written since the last flush are lost if the process dies; the caller chooses when to
    flush (`flush_every_s` also flushes inside `write` once that many seconds have passed).
    Every flush rewrites the whole file, which is fine for the run logs here (megabytes).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        fsync: bool = False,
        flush_every_s: float | None = None,
        create: bool = False,
    ):
        self.path = epath.Path(path)
        self.local = is_local(self.path)
        self.fsync = fsync
        self.flush_every_s = flush_every_s
        self._f = None  # local: the open append handle
        self._lines: list[str] | None = None  # remote: the file's lines, loaded on first use
        self._dirty = False
        self._last_flush = time.monotonic()
        if create and self.local:
            self._open()

    def _open(self) -> None:
        drop_torn_tail(self.path)
        self._f = open(self.path, "a")  # noqa: SIM115 - closed in close()

    def _remote_lines(self) -> list[str]:
        if self._lines is None:
            self._lines = [json.dumps(r) + "\n" for r in read_jsonl(self.path)]
        return self._lines

    def write(self, records: list[dict]) -> None:
        if not records:
            return
        if self.local:
            if self._f is None:
                self._open()
            for r in records:
                self._f.write(json.dumps(r) + "\n")
            self._f.flush()
            if self.fsync:
                os.fsync(self._f.fileno())
            return
        self._remote_lines().extend(json.dumps(r) + "\n" for r in records)
        self._dirty = True
        due = self.flush_every_s is not None
        if due and time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        """Remote: upload the whole file if records were written since the last upload.
        Local: nothing to do (every write is already flushed)."""
        self._last_flush = time.monotonic()
        if self.local or not self._dirty:
            return
        self.path.write_text("".join(self._lines))
        self._dirty = False

    def keep_only(self, keep: Callable[[dict], bool]) -> None:
        """Rewrite the file with the records that `keep` accepts (a missing file stays
        missing). Local: through a temporary file and a rename."""
        if self.local:
            self._close_handle()
            if not self.path.exists():
                return
            kept = [r for r in read_jsonl(self.path) if keep(r)]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
            tmp.replace(self.path)
            return
        if not self.path.exists():
            self._lines, self._dirty = [], False
            return
        self._lines = [json.dumps(r) + "\n" for r in read_jsonl(self.path) if keep(r)]
        self._dirty = True
        self.flush()

    def delete(self) -> None:
        """Remove the file; later writes start a new one."""
        self._close_handle()
        self.path.unlink(missing_ok=True)
        self._lines, self._dirty = [], False

    def _close_handle(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def close(self) -> None:
        self.flush()
        self._close_handle()


# The field `StepLog` stamps on every record: the RL step that wrote it.
WRITTEN_AT = "written_at_step"


def written_at(record: dict) -> int:
    """The RL step that wrote `record` (records of runs logged before the stamp existed: their
    own `step`, which was the writing step for every record those runs could resume)."""
    return record.get(WRITTEN_AT, record.get("step", 0))


class StepLog:
    """A run's record files (`names` under `folder`), each record stamped with the RL step
    that wrote it (`WRITTEN_AT`), and cut by that stamp when the run resumes.

    A resumed run restores the checkpoint of step k and redoes the steps after it, writing
    their records again, so `restart_at(k)` first removes what those steps wrote, from every
    file by the same rule. What a record is about cannot decide it: a step may record an
    earlier step's results (with `rl.anchor_lag = 1` the anchor pairs step t trains on are
    step t-1's, and labelled so), and such records survive a cut by their label and are then
    written twice. The journals of real executions (`wmrl.autoresearch.anchors`) are not step logs:
    they are kept whole, keyed by what was executed, so that a redone step reuses them.

    Local files are appended as records come; remote ones are uploaded by `flush`, which the
    caller runs before every checkpoint so that no checkpoint is ahead of its records.
    """

    def __init__(self, folder: str | os.PathLike, names: tuple[str, ...]):
        folder = epath.Path(folder)
        self.files = {name: JsonlWriter(folder / name) for name in names}

    def restart_at(self, step: int | None) -> None:
        """Keep the records written at steps <= `step` (what the restored checkpoint of step
        `step` had seen), or none (None: a fresh run)."""
        for f in self.files.values():
            if step is None:
                f.delete()
            else:
                f.keep_only(lambda r: written_at(r) <= step)

    def write(self, name: str, records: list[dict], step: int) -> list[dict]:
        """Append `records` to file `name`, written by RL step `step`; returns them stamped."""
        stamped = [{**r, WRITTEN_AT: int(step)} for r in records]
        self.files[name].write(stamped)
        return stamped

    def flush(self) -> None:
        for f in self.files.values():
            f.flush()

    def close(self) -> None:
        for f in self.files.values():
            f.close()
