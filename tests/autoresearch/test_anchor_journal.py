"""The anchor journal after a crash: a torn last line is dropped on open, so the first record
appended afterwards starts its own line and survives (it used to be glued to the torn one and
lost with it on the next read)."""

import json

from wmrl.autoresearch.anchors import AnchorJournal, script_sha


def test_record_after_a_torn_tail_survives(tmp_path):
    path = tmp_path / "anchors.jsonl"
    whole = {
        "step": 0,
        "row": 0,
        "sha": script_sha("a"),
        "task_id": "t",
        "status": 3,
        "reward": 0.2,
    }
    torn = json.dumps({**whole, "row": 1, "sha": script_sha("b")})[:25]  # a kill mid-write
    path.write_text(json.dumps(whole) + "\n" + torn)
    journal = AnchorJournal(path)
    assert set(journal.done) == {(0, 0)}  # the torn record is not a completed execution
    journal.record(0, 1, "b", "t", 5, 0.75)
    journal.close()
    lines = path.read_text().splitlines()
    assert [json.loads(x)["row"] for x in lines] == [0, 1]  # every line is a whole record
    again = AnchorJournal(path)
    assert again.lookup(0, 1, "b")["reward"] == 0.75 and again.lookup(0, 0, "a") is not None
    assert again.lookup(0, 1, "other script") is None
    again.close()
