"""The multi-turn observation: its fields, the error-type parser and the one template."""

from __future__ import annotations

import math

import pytest

from wmrl.autoresearch.env.grader import Status
from wmrl.autoresearch.env.observation import (
    ERROR_TYPES,
    Observation,
    error_type_of,
    make_observation,
    observation_of,
    render_observation,
    static_fields,
    static_observation,
)
from wmrl.autoresearch.env.result import ExecutionResult

KEY_ERROR = """\
Traceback (most recent call last):
  File "/work/script.py", line 9, in <module>
    y = train["Label"]
  File "/venv/lib/python3.11/site-packages/pandas/core/frame.py", line 3761, in __getitem__
    indexer = self.columns.get_loc(key)
KeyError: 'Label'
"""

# A chained exception: the last traceback's exception is the one that killed the script.
CHAINED = """\
Traceback (most recent call last):
  File "/work/script.py", line 3, in <module>
    import lightgbm
ModuleNotFoundError: No module named 'lightgbm'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/work/script.py", line 5, in <module>
    model = fit(X, y)
TypeError: fit() missing 1 required positional argument: 'w'
"""

MULTILINE_VALUE_ERROR = """\
/venv/lib/python3.11/site-packages/sklearn/base.py:1: UserWarning: something
  warnings.warn(
Traceback (most recent call last):
  File "/work/script.py", line 12, in <module>
    model.fit(X, y)
ValueError: Input X contains NaN.
LogisticRegression does not accept missing values encoded as NaN natively.
KeyError: this line is part of the message, not a second exception
"""

PANDAS_ERROR = """\
Traceback (most recent call last):
  File "/work/script.py", line 4, in <module>
    pd.read_csv("x")
pandas.errors.ParserError: Error tokenizing data. C error: Expected 2 fields in line 3, saw 4
"""

CUT_TAIL = "    return self._engine.get_loc(casted_key)\nIndexError: index 7 is out of bounds\n"


@pytest.mark.parametrize(
    "stderr,expected",
    [
        (KEY_ERROR, "KeyError"),
        (CHAINED, "TypeError"),
        (MULTILINE_VALUE_ERROR, "ValueError"),
        (PANDAS_ERROR, "ValueError"),  # a ValueError subclass in pandas
        (CUT_TAIL, "IndexError"),  # the tail was cut before the Traceback header
        (
            "Traceback (most recent call last):\n  x\nModuleNotFoundError: no sklearnx\n",
            "ImportError",
        ),
        ("Traceback (most recent call last):\n  x\nUnboundLocalError: local 'm'\n", "NameError"),
        (
            "Traceback (most recent call last):\n  x\nNameError: name 'np' is not defined\n",
            "NameError",
        ),
        (
            "Traceback (most recent call last):\n  x\nnumpy.core._exceptions._ArrayMemoryError: "
            "Unable to allocate 8.00 GiB\n",
            "MemoryError",
        ),
        ("Traceback (most recent call last):\n  x\nZeroDivisionError: division by zero\n", "other"),
        ("Traceback (most recent call last):\n  x\nmylib.WeirdError: boom\n", "other"),
        ("", "other"),  # killed by a signal or sys.exit(1): no traceback
        ("some log line\n", "other"),
    ],
)
def test_error_type_of_hand_tracebacks(stderr, expected):
    assert expected in ERROR_TYPES
    assert error_type_of(stderr, Status.RUNTIME_ERROR) == expected


def test_error_type_is_none_unless_runtime_error_and_memory_for_oom():
    for status in Status:
        if status != Status.RUNTIME_ERROR:
            assert error_type_of(KEY_ERROR, status) == "none"
    assert error_type_of("", Status.RUNTIME_ERROR, oom_killed=True) == "MemoryError"


def result(**kw) -> ExecutionResult:
    base = dict(
        task_id="t",
        status=Status.VALID,
        reward=0.93,
        score=0.91,
        percentile=0.86,
        runtime_s=1.2649,
        stdout_tail="test accuracy 0.91",
        stderr_tail="",
        isolation="namespaces",
        validation=0.843749,
    )
    base.update(kw)
    return ExecutionResult(**base)


def test_observation_of_keeps_exactly_the_four_fields_rounded():
    obs = observation_of(result())
    assert [f for f in Observation.__dataclass_fields__] == [
        "status",
        "error_type",
        "runtime_s",
        "validation",
    ]
    assert obs == Observation(Status.VALID, "none", 1.3, 0.8437)
    # a test-set score never reaches it, even if a result carries one next to no validation
    assert observation_of(result(validation=None)).validation is None
    failed = observation_of(
        result(status=Status.RUNTIME_ERROR, error_type="KeyError", score=None, validation=None)
    )
    assert failed == Observation(Status.RUNTIME_ERROR, "KeyError", 1.3, None)
    # a validation value reported next to a non-VALID status is dropped
    assert observation_of(result(status=Status.INVALID_SUBMISSION)).validation is None


def test_default_execution_result_fields_keep_old_callers_working():
    r = ExecutionResult("t", Status.NO_SUBMISSION, 0.2, None, None, 0.5, "", "", "rlimits")
    assert r.validation is None and r.error_type == "none"
    d = r.to_json()
    assert d["validation"] is None and d["error_type"] == "none" and d["status"] == "NO_SUBMISSION"


def test_render_template_is_one_ascii_line():
    obs = make_observation(Status.RUNTIME_ERROR, "KeyError", 1.24, None)
    text = render_observation(obs, "accuracy")
    assert (
        text == "status: RUNTIME_ERROR | error: KeyError | runtime: 1.2s | validation accuracy: n/a"
    )
    valid = render_observation(make_observation(Status.VALID, "none", 12.0, 0.84), "rmse")
    assert valid == "status: VALID | error: none | runtime: 12.0s | validation rmse: 0.84"
    big = render_observation(make_observation(Status.VALID, "none", 3.05, 12345.678), "rmse")
    assert big.endswith("validation rmse: 1.235e+04")
    for t in (text, valid, big):
        assert t.isascii() and "\n" not in t and len(t) <= 100
    # deterministic: equal observations render equally, from whichever source
    assert render_observation(Observation.from_json(obs.to_json()), "accuracy") == text


def test_make_observation_rejects_bad_fields():
    with pytest.raises(ValueError, match="error_type"):
        make_observation(Status.RUNTIME_ERROR, "SegFault", 1.0, None)
    with pytest.raises(ValueError, match="runtime_s"):
        make_observation(Status.VALID, "none", math.nan, 0.5)
    # heads predicted apart are made consistent by the same rule as real observations
    assert make_observation(Status.RUNTIME_ERROR, "none", 1.0, None).error_type == "other"
    assert make_observation(Status.VALID, "KeyError", 1.04, 0.5) == Observation(
        Status.VALID, "none", 1.0, 0.5
    )
    assert make_observation(Status.TIMEOUT, "none", 60.0, 0.9).validation is None
    assert make_observation(Status.MALFORMED, "none", -0.01, None).runtime_s == 0.0


def test_static_fields_override_predicted_ones():
    predicted = make_observation(Status.VALID, "none", 4.0, 0.9)
    bad_syntax = "import os\nprint((1\n"
    assert static_fields(bad_syntax) == {
        "status": Status.MALFORMED,
        "error_type": "none",
        "runtime_s": 0.0,
        "validation": None,
    }
    assert static_observation(bad_syntax, predicted) == Observation(
        Status.MALFORMED, "none", 0.0, None
    )
    unbound = "import pandas as pd\nm = LogisticRegression()\n"
    assert static_observation(unbound, predicted) == Observation(
        Status.RUNTIME_ERROR, "NameError", 4.0, None
    )
    assert static_observation(unbound, predicted, names=False) == predicted
    assert static_fields("import os\nprint(os.sep)\n") == {}
