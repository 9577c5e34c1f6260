"""A workdir whose config.json was tampered with is refused before the run starts, in one
line naming the file and the field, and the file is left as it was: once a list, `null` or
a string raised AttributeError, deep nesting RecursionError, bad JSON named neither file
nor field, and a wrong type in a field a resume may change (`rl.steps: "many"`) started the
run. So is a workdir whose journals hold a record no execution could write (an infinite
reward was reused as an anchor's), naming the file and the line. Checked in process
(`check_resumable`) and through `python -m wmrl.main`."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wmrl.autoresearch.experiment import check_resumable
from wmrl.config_errors import ConfigError
from wmrl.experiment.config import load_config_file

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "autoresearch_tiny.py"


def saved_text() -> str:
    """What `wmrl.main.prepare_workdir` writes for the tiny config."""
    return load_config_file(CONFIG).to_json_best_effort(indent=2) + "\n"


def variants() -> dict[str, tuple[bytes, str]]:
    """name -> (config.json's bytes, what the one line must name)."""
    text = saved_text()
    d = json.loads(text)

    def edited(**sections) -> bytes:
        return json.dumps({**d, **sections}, indent=2).encode()

    rl = d["rl"]
    return {
        "not_json": (b"this is not json\n", "is not valid JSON"),
        "truncated": (text[: len(text) // 2].encode(), "is not valid JSON"),
        "not_utf8": (b'{"rl": "\xff"}', "is not UTF-8"),
        "deep": (b"[" * 100_000, "is not valid JSON"),
        "list": (json.dumps([d]).encode(), "must hold a JSON object (a config), got list"),
        "null": (b"null", "must hold a JSON object (a config), got NoneType"),
        "string": (json.dumps(text).encode(), "must hold a JSON object (a config), got str"),
        "section_a_number": (edited(rl=5), "config.rl: must be a"),
        "wrong_type": (edited(rl={**rl, "group_size": "2"}), "config.rl.group_size: must be an"),
        "wrong_type_resumable": (edited(rl={**rl, "steps": "many"}), "config.rl.steps: must be"),
        "out_of_bounds": (edited(rl={**rl, "learning_rate": -1.0}), "config.rl.learning_rate"),
        "value_a_mapping": (edited(rl={**rl, "group_size": {"a": 1}}), "config.rl.group_size"),
        "unknown": (edited(bogus=1), "config.bogus: unknown field"),
        "unknown_nested": (edited(rl={**rl, "stepz": 3}), "config.rl.stepz: unknown field"),
        "missing": (
            edited(rl={k: v for k, v in rl.items() if k != "group_size"}),
            "config.rl.group_size: missing",
        ),
    }


def test_the_saved_config_as_written_resumes(tmp_path):
    (tmp_path / "config.json").write_text(saved_text())
    check_resumable(load_config_file(CONFIG), tmp_path)
    # without a field a resume may change (older runs lack some): still resumable
    d = json.loads(saved_text())
    del d["rl"]["eval_at_s"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    check_resumable(load_config_file(CONFIG), tmp_path)


@pytest.mark.parametrize("name", list(variants()))
def test_a_tampered_config_json_is_one_error_naming_file_and_field(tmp_path, name):
    data, needle = variants()[name]
    (tmp_path / "config.json").write_bytes(data)
    with pytest.raises(ConfigError) as e:
        check_resumable(load_config_file(CONFIG), tmp_path)
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'config.json'}: ") and needle in message, message
    assert "\n" not in message and len(message) < 600, message
    assert (tmp_path / "config.json").read_bytes() == data


def journal_line(**fields) -> str:
    rec = {"step": 0, "row": 0, "sha": "0123456789abcdef", "task_id": "t", "status": 5,
           "reward": 0.75, **fields}  # fmt: skip
    return json.dumps(rec) + "\n"


# A resume's journals, tampered with (file -> its text, the file named, what the line says).
JOURNALS = {
    "anchors_inf": ("anchors.jsonl", journal_line() + journal_line(row=1, reward=math.inf),
                    "line 2: reward inf"),
    "anchors_below_zero": ("anchors.jsonl", journal_line(status=1, reward=-7),
                           "line 1: reward -7 with status RUNTIME_ERROR"),
    "heldout_unknown_status": ("heldout.jsonl", journal_line(status=9), "line 1: status 9"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(JOURNALS))
def test_a_tampered_journal_is_refused_before_the_resume(tmp_path, name):
    file, text, needle = JOURNALS[name]
    (tmp_path / "config.json").write_text(saved_text())
    (tmp_path / file).write_text(text)
    with pytest.raises(ValueError, match=rf"^{tmp_path / file} {needle}"):
        check_resumable(load_config_file(CONFIG), tmp_path)


@pytest.mark.real  # subprocesses: the entry point as a user runs it
def test_the_command_line_refuses_each_tampering_in_one_line(tmp_path):
    cases = {name: ({"config.json": data}, f"{tmp_path / name / 'config.json'}: {needle}")
             for name, (data, needle) in variants().items()}  # fmt: skip
    for name, (file, text, needle) in JOURNALS.items():
        files = {"config.json": saved_text().encode(), file: text.encode()}
        cases[name] = (files, f"{tmp_path / name / file} {needle}")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = {}
    for name, (files, _) in cases.items():
        wd = tmp_path / name
        wd.mkdir()
        for file, data in files.items():
            (wd / file).write_bytes(data)
        cmd = [sys.executable, "-m", "wmrl.main", f"--config={CONFIG}", f"--workdir={wd}"]
        procs[name] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    try:
        for name, p in procs.items():
            _, stderr = p.communicate(timeout=300)
            files, needle = cases[name]
            wd = tmp_path / name
            assert p.returncode == 2, (name, stderr[-2000:])
            assert "Traceback" not in stderr, (name, stderr[-2000:])
            errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
            assert len(errors) == 1 and errors[0].startswith(f"error: {needle}"), (name, stderr)
            # nothing rewritten, nothing started
            assert {f.name: f.read_bytes() for f in wd.iterdir()} == files, name
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
