"""A resumed run reuses its journals' records only if an execution could have written them:
a record whose reward is not on the reward ladder for its status (inf, 1e308 and -7 once
came back as anchor rewards), whose status is unknown, or whose keys are not what the
journal writes is refused in one line naming the file and the line. Real journal files,
opened as the trainer opens them (`open_journal`) and reused through `execution.submit`."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from wmrl.autoresearch import execution
from wmrl.autoresearch.anchors import AnchorJournal, JournalError, open_journal, script_sha
from wmrl.autoresearch.env.fake_executor import FakeExecutor, Outcome, sha
from wmrl.autoresearch.env.grader import Status

TASK = SimpleNamespace(id="t0")
SCRIPTS = ["a = 1", "b = 2", "c = 3", "d = 4"]
# What the sandbox would give each script (the journal of step 0 holds these).
OUTCOMES = [Outcome(Status.VALID, 0.875), Outcome(Status.RUNTIME_ERROR),
            Outcome(Status.NO_SUBMISSION), Outcome(Status.UNGRADED)]  # fmt: skip
# Written by hand from the ladder (0, 0.1, 0.1, 0.2, 0.2, 0.5 + 0.5 * pos, NaN -> null).
LADDER = {0: 0.0, 1: 0.1, 2: 0.1, 3: 0.2, 4: 0.2, 6: None}


def good_records() -> list[dict]:
    recs = []
    for row, (script, status, r) in enumerate(
        zip(SCRIPTS, (5, 1, 3, 6), (0.875, 0.1, 0.2, None), strict=True)
    ):
        recs.append({"step": 0, "row": row, "sha": script_sha(script), "task_id": "t0",
                     "status": status, "reward": r, "runtime_s": 1.5})  # fmt: skip
    return recs


def write_journal(path, recs, raw_line: str | None = None, at: int = 2) -> None:
    lines = [json.dumps(r) for r in recs]
    if raw_line is not None:
        lines[at] = raw_line
    path.write_text("\n".join(lines) + "\n")


def test_a_journal_on_the_ladder_is_reused_exactly(tmp_path):
    write_journal(tmp_path / "anchors.jsonl", good_records())
    journal = open_journal(tmp_path)
    fake = FakeExecutor({sha(s): o for s, o in zip(SCRIPTS, OUTCOMES, strict=True)})
    out, new = execution.collect(journal, execution.submit(
        journal, fake, 0, np.arange(4), [TASK] * 4, SCRIPTS, "anchor"))  # fmt: skip
    assert new == 0 and fake.calls == []  # every row from the journal
    np.testing.assert_array_equal(out["reward"], [0.875, 0.1, 0.2, np.nan])
    np.testing.assert_array_equal(out["status"], [5, 1, 3, 6])
    journal.close()
    fake.close()


def test_every_ladder_value_and_a_torn_tail_are_accepted(tmp_path):
    recs = [{"step": 1, "row": s, "sha": script_sha(str(s)), "task_id": "t", "status": s,
             "reward": r} for s, r in LADDER.items()]  # fmt: skip
    recs += [{"step": 1, "row": 10 + i, "sha": script_sha(f"v{i}"), "task_id": "t",
              "status": 5, "reward": r} for i, r in enumerate((0.5, 0.75, 1.0, 1))]  # fmt: skip
    path = tmp_path / "anchors.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs) + '{"step": 1, "row": 99, "sh')
    journal = AnchorJournal(path)
    assert len(journal.done) == len(recs)  # the torn last line is not a record
    assert journal.lookup(1, 3, "3")["reward"] == 0.2
    journal.close()


BAD_RECORDS = {
    # rewards off the ladder for their status
    "inf": ({"reward": math.inf}, "reward inf"),
    "huge": ({"reward": 1e308}, "reward 1e+308"),
    "negative": ({"reward": -7}, "reward -7"),
    "nan_valid": ({"status": 5, "reward": math.nan}, "reward nan"),
    "valid_below_half": ({"status": 5, "reward": 0.3}, "between 0.5 and 1"),
    "valid_above_one": ({"status": 5, "reward": 1.25}, "between 0.5 and 1"),
    "runtime_error_0.15": ({"status": 1, "reward": 0.15}, "RUNTIME_ERROR's reward is 0.1"),
    "valid_null": ({"status": 5, "reward": None}, "reward None"),
    "ungraded_scored": ({"status": 6, "reward": 0.5}, "UNGRADED's reward is null"),
    "reward_text": ({"reward": "0.2"}, "reward '0.2'"),
    "reward_bool": ({"reward": True}, "reward True"),
    # statuses no grader gives
    "status_9": ({"status": 9}, "status 9"),
    "status_negative": ({"status": -1}, "status -1"),
    "status_text": ({"status": "3"}, "status '3'"),
    "status_float": ({"status": 3.0}, "status 3.0"),
    "status_missing": ({"status": ...}, "status"),
    # keys and observation fields
    "step_negative": ({"step": -1}, "step -1"),
    "row_fraction": ({"row": 1.5}, "row 1.5"),
    "sha_number": ({"sha": 7}, "sha 7"),
    "task_null": ({"task_id": None}, "task_id None"),
    "runtime_negative": ({"runtime_s": -1.0}, "runtime_s -1.0"),
    "runtime_inf": ({"runtime_s": math.inf}, "runtime_s inf"),
    "validation_nan": ({"validation": math.nan}, "validation nan"),
    "error_type_number": ({"error_type": 3}, "error_type 3"),
    "benchmark_text": ({"benchmark": "gold"}, "benchmark 'gold'"),
    "cut_but_graded": ({"cut": True}, "cut True with status NO_SUBMISSION"),
    "cut_text": ({"status": 6, "reward": None, "cut": "yes"}, "cut 'yes'"),
}


@pytest.mark.parametrize("name", list(BAD_RECORDS))
@pytest.mark.parametrize("kind", ["anchors", "heldout"])
def test_a_record_no_execution_could_write_is_refused(tmp_path, name, kind):
    edit, needle = BAD_RECORDS[name]
    recs = good_records()
    recs[2] = {k: v for k, v in {**recs[2], **edit}.items() if v is not ...}
    path = tmp_path / f"{kind}.jsonl"
    write_journal(path, recs)
    before = path.read_bytes()
    with pytest.raises(JournalError) as e:
        open_journal(tmp_path, kind)
    message = str(e.value)
    assert message.startswith(f"{path} line 3: "), message
    assert needle in message and "\n" not in message, message
    assert path.read_bytes() == before  # the journal is left as it was


@pytest.mark.parametrize(
    "line,needle",
    [("this is not json", "not JSON"), ("[1, 2]", "not a JSON object"), ("7", "not a JSON object")],
)
def test_a_line_that_is_no_record_is_refused(tmp_path, line, needle):
    path = tmp_path / "anchors.jsonl"
    write_journal(path, good_records(), raw_line=line)
    with pytest.raises(JournalError, match=rf"^{path} line 3: {needle}"):
        AnchorJournal(path)


def test_another_process_s_journal_is_checked_too(tmp_path):
    recs = good_records()
    recs[1]["reward"] = math.inf
    write_journal(tmp_path / "anchors.p1.jsonl", recs)
    with pytest.raises(JournalError, match=r"anchors\.p1\.jsonl line 2: reward inf"):
        open_journal(tmp_path)


def test_the_journal_never_writes_what_it_would_refuse(tmp_path):
    journal = AnchorJournal(tmp_path / "anchors.jsonl")
    for status, reward in ((Status.RUNTIME_ERROR, 0.25), (Status.VALID, math.inf), (9, 0.1)):
        with pytest.raises(ValueError):
            journal.record(0, 0, "x", "t", status, reward)
    journal.record(0, 0, "x", "t", Status.UNGRADED, math.nan)  # NaN is journalled as null
    journal.close()
    assert json.loads((tmp_path / "anchors.jsonl").read_text())["reward"] is None
