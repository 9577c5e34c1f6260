"""Every record a run's workdir holds, read back for comparison between two runs
(tests/autoresearch/test_resume_records.py): a run killed and resumed against an uninterrupted one.

The files are found by listing the workdir, never from a list of names: a file of a kind this
module does not know fails the comparison, so a new record file cannot escape it. Kinds:
JSON-lines files (every record), TensorBoard event files (every scalar, as TensorBoard reads a
resumed run: a session start at step s hides the events of the earlier files at steps >= s),
JSON documents (whole), checkpoints (their steps) and plots (their names: the images are
drawn from the records).

Values that differ between any two runs of the same config are left out: what the clock
measures (fields in seconds, named `*_s`) and how many of a step's executions the journal
supplied (`reused_from_journal`, nonzero where a resumed run redoes a step).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from pathlib import Path

UNCOMPARABLE = ("reused_from_journal",)


def comparable(name: str) -> bool:
    return not name.endswith("_s") and name.split("/")[-1] not in UNCOMPARABLE


def canonical(value):
    """`value` without its uncomparable fields (at any depth), as a hashable JSON string."""

    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if comparable(k)}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return json.dumps(strip(value), sort_keys=True)


def kind_of(rel: Path) -> str:
    top = rel.parts[0]
    if top in ("checkpoints", "plots", "tb"):
        return top
    if rel.suffix in (".jsonl", ".json"):
        return rel.suffix[1:]
    raise AssertionError(f"{rel}: a file of a kind the record comparison does not know")


def jsonl_records(path: Path) -> Counter:
    return Counter(canonical(json.loads(line)) for line in path.read_text().splitlines())


def _events(path: Path):
    """The Event protos of one TensorBoard file (TFRecord framing: length, its CRC, data, CRC)."""
    from tensorboardX.proto import event_pb2

    data, i = path.read_bytes(), 0
    while i < len(data):
        (length,) = struct.unpack("<Q", data[i : i + 8])
        yield event_pb2.Event.FromString(data[i + 12 : i + 12 + length])
        i += 12 + length + 4


def tensorboard_scalars(folder: Path) -> Counter:
    """(tag, step, value) of every scalar TensorBoard shows for `folder`: the files in the
    order written, a session start at step s purging what earlier files logged at steps >= s."""
    from tensorboardX.proto import event_pb2

    start = event_pb2.SessionLog.START
    files = sorted(folder.glob("events.out.tfevents.*"), key=lambda p: int(p.name.split(".")[3]))
    shown: list[tuple] = []
    for path in files:
        for ev in _events(path):
            if ev.HasField("session_log") and ev.session_log.status == start:
                shown = [s for s in shown if s[1] < ev.step]
            for v in ev.summary.value:
                if comparable(v.tag):
                    shown.append((v.tag, ev.step, v.simple_value))
    return Counter(shown)


def read_run(workdir: Path) -> dict:
    """{file or group: its comparable content} for every file under `workdir`."""
    out: dict = {}
    for path in sorted(p for p in workdir.rglob("*") if p.is_file()):
        rel = path.relative_to(workdir)
        kind = kind_of(rel)
        if kind == "jsonl":
            out[str(rel)] = jsonl_records(path)
        elif kind == "json":
            out[str(rel)] = canonical(json.loads(path.read_text()))
        elif kind == "tb" and "tb" not in out:
            out["tb"] = tensorboard_scalars(workdir / "tb")
        elif kind == "checkpoints":
            out.setdefault("checkpoints", set()).add(rel.parts[1])
        elif kind == "plots":
            out.setdefault("plots", set()).add(rel.name)
    return out


def differences(got: dict, want: dict) -> list[str]:
    """What `got` has twice or lacks against `want`, file by file (empty: the same)."""
    problems = [f"{name}: missing" for name in want.keys() - got.keys()]
    problems += [f"{name}: not in the reference run" for name in got.keys() - want.keys()]
    for name in sorted(want.keys() & got.keys()):
        g, w = got[name], want[name]
        if isinstance(w, Counter):
            extra, lost = g - w, w - g
            if extra:
                problems.append(f"{name}: {sum(extra.values())} records too many: {list(extra)}")
            if lost:
                problems.append(f"{name}: {sum(lost.values())} records lost: {list(lost)}")
        elif g != w:
            problems.append(f"{name}: differs: {g} != {w}")
    return problems
