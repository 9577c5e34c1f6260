"""`wmrl.tools.turn_status`: the per-turn table and the reasons of broken revisions, on
hand-built turn records."""

from wmrl.tools.turn_status import table, why_broken

EARLIER = "import os\nfrom sklearn.linear_model import Ridge\nm = Ridge(alpha=1.0)\n"


def _turn(t, status, script, static=None, error="none", undefined=(), prompt=None):
    return {
        "turn": t, "task": "t", "split": "train", "status": status, "error_type": error,
        "static": static, "static_why": None, "undefined": list(undefined), "tokens": 10,
        "hit_max_new": False, "prompt_truncated": False, "script": script, "prompt": prompt,
    }  # fmt: skip


def test_why_a_flagged_revision_broke():
    known = {"import os", "from sklearn.linear_model import Ridge", "m = Ridge(alpha=#)"}
    ok = _turn(2, "VALID", EARLIER, prompt=EARLIER)
    assert why_broken(ok, EARLIER, known) is None  # not flagged: nothing to explain
    spliced = _turn(2, "MALFORMED", "import os\nm = Ridge(alpha=1.0 os.environ\n", "MALFORMED")
    assert why_broken(spliced, EARLIER, known) == "splice"
    # the model line switched to a class the earlier script never imported
    switched = (
        "import os\nfrom sklearn.linear_model import Ridge\nm = Ridge(alpha=2.0)\nf = Lasso()\n"
    )
    new = _turn(2, "RUNTIME_ERROR", switched, "RUNTIME_ERROR", "NameError", ["Lasso"])
    assert why_broken(new, EARLIER, known | {"f = Lasso()"}) == "new class"
    dropped = _turn(2, "RUNTIME_ERROR", "import os\nm = Ridge(alpha=1.0)\n", "RUNTIME_ERROR",
                    "NameError", ["Ridge"])  # fmt: skip
    assert why_broken(dropped, EARLIER, known) == "dropped import"


def test_table_counts_each_turn():
    recs = [
        [_turn(1, "VALID", EARLIER), _turn(2, "MALFORMED", "m = (", "MALFORMED")],
        [_turn(1, "RUNTIME_ERROR", EARLIER, "RUNTIME_ERROR", "NameError", ["x"]),
         _turn(2, "VALID", EARLIER)],
    ]  # fmt: skip
    lines = table(recs).splitlines()
    assert lines[2] == "| 1 | 2 | 1 | 0 | 1 | 1 | 1 | 0 | 0 |"
    assert lines[3] == "| 2 | 2 | 1 | 1 | 0 | 0 | 1 | 0 | 0 |"
    assert "turn 2, flagged by the static check: {'splice': 1}" in table(recs, {"t": set()})
