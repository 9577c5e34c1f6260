"""What the agent reads after a turn of a multi-turn episode: a few fields, one template.

An ``Observation`` holds exactly the fields a world model can predict (a head per field), so
a real observation and a WM-written one differ in their values only, never in their form:

    status      the ladder's ``Status`` (MALFORMED ... VALID, UNGRADED)
    error_type  the exception class of a RUNTIME_ERROR, one of ``ERROR_TYPES`` ("none" for
                every other status)
    runtime_s   wall-clock seconds, rounded to ``RUNTIME_DECIMALS`` (0.1 s)
    validation  the raw validation metric (e.g. accuracy 0.84) on the episode's validation
                split when the submission is VALID, rounded to ``VALIDATION_DIGITS``
                significant digits; None otherwise

``render_observation`` is the one template, for real and WM observations alike:

    status: RUNTIME_ERROR | error: KeyError | runtime: 1.2s | validation accuracy: n/a

Nothing here is derived from the hidden test labels: the validation metric comes from rows
carved out of the public train.csv (``episode.make_episode_task``), and the test-set score,
percentile and reward of an ``ExecutionResult`` are dropped.
"""

from __future__ import annotations

import builtins
import dataclasses
import math
import re
from typing import TYPE_CHECKING

from wmrl.autoresearch.env.grader import Status, check_script, undefined_names

if TYPE_CHECKING:
    from wmrl.autoresearch.env.result import ExecutionResult

# Fixed: a WM head predicts an index into this tuple. "none": not a RUNTIME_ERROR; "other":
# a RUNTIME_ERROR whose exception is none of the named ones (or no traceback, e.g. a signal or
# `sys.exit(1)`). ImportError covers ModuleNotFoundError (a subclass); MemoryError covers an
# OOM kill (no traceback).
ERROR_TYPES = (
    "none",
    "NameError",
    "KeyError",
    "ValueError",
    "TypeError",
    "IndexError",
    "AttributeError",
    "ImportError",
    "MemoryError",
    "other",
)
RUNTIME_DECIMALS = 1
VALIDATION_DIGITS = 4

# Library exceptions a solution commonly dies of, by class name, mapped to their builtin base
# (the builtin ones are resolved through their MRO).
_LIBRARY_EXCEPTIONS = {
    "ParserError": "ValueError",  # pandas.errors
    "EmptyDataError": "ValueError",  # pandas.errors
    "IntCastingNaNError": "ValueError",  # pandas.errors
    "NotFittedError": "ValueError",  # sklearn.exceptions (ValueError, AttributeError)
    "AxisError": "ValueError",  # numpy (ValueError, IndexError)
    "_ArrayMemoryError": "MemoryError",  # numpy's MemoryError
    "ArrayMemoryError": "MemoryError",
}
_TRACEBACK_HEADER = "Traceback (most recent call last):"
# An exception line: a (dotted) class name alone or followed by ": message".
_EXCEPTION_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(?::.*)?")


def error_class(name: str) -> str:
    """An exception class name (possibly dotted) mapped into ``ERROR_TYPES``."""
    short = name.rsplit(".", 1)[-1]
    short = _LIBRARY_EXCEPTIONS.get(short, short)
    cls = getattr(builtins, short, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        for base in cls.__mro__:
            if base.__name__ in ERROR_TYPES:
                return base.__name__
    return "other"


def _last_exception_name(stderr_tail: str) -> str | None:
    """The class name on the exception line of the last traceback in ``stderr_tail``: the
    first unindented line after the last ``Traceback`` header (a chained exception's final
    one). When the tail was cut before the header, the last unindented line that looks like
    an exception line and names an exception class."""
    lines = stderr_tail.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK_HEADER]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if line and not line[0].isspace():
                m = _EXCEPTION_LINE.fullmatch(line.rstrip())
                return m.group(1) if m else None
        return None
    for line in reversed(lines):
        if not line or line[0].isspace():
            continue
        m = _EXCEPTION_LINE.fullmatch(line.rstrip())
        if m and re.search(r"(Error|Exception|Exit|Interrupt)$", m.group(1)):
            return m.group(1)
    return None


def error_type_of(stderr_tail: str, status: Status, oom_killed: bool = False) -> str:
    """The exception class of a RUNTIME_ERROR, one of ``ERROR_TYPES``.

    "none" for every status but RUNTIME_ERROR (a TIMEOUT's or a MALFORMED script's status
    already says what happened); "MemoryError" for an OOM kill (``oom_killed``, no traceback);
    else the class on the last traceback's exception line mapped into the list ("other" when
    none is named there, e.g. killed by a signal or ``sys.exit(1)``)."""
    if Status(status) != Status.RUNTIME_ERROR:
        return "none"
    if oom_killed:
        return "MemoryError"
    name = _last_exception_name(stderr_tail or "")
    return "other" if name is None else error_class(name)


def _round_runtime(runtime_s: float) -> float:
    return round(max(0.0, float(runtime_s)), RUNTIME_DECIMALS)


def _round_validation(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{VALIDATION_DIGITS}g}")


@dataclasses.dataclass(frozen=True)
class Observation:
    """One turn's feedback. Build it with ``make_observation`` (or ``observation_of``) so the
    fields are checked and rounded the same way for real and WM observations."""

    status: Status
    error_type: str
    runtime_s: float
    validation: float | None

    def to_json(self) -> dict:
        return {
            "status": self.status.name,
            "status_id": int(self.status),
            "error_type": self.error_type,
            "runtime_s": self.runtime_s,
            "validation": self.validation,
        }

    @classmethod
    def from_json(cls, d: dict) -> Observation:
        return make_observation(
            Status(d["status_id"]), d["error_type"], d["runtime_s"], d["validation"]
        )


def make_observation(
    status: Status | int, error_type: str, runtime_s: float, validation: float | None
) -> Observation:
    """An Observation with its fields checked, made consistent and rounded: the one
    constructor for real and WM-predicted fields (a WM's heads predict each field on its
    own). ``error_type`` must be one of ``ERROR_TYPES`` (ValueError naming it otherwise); it is
    forced to "none" unless the status is RUNTIME_ERROR, and a RUNTIME_ERROR with "none" reads
    "other". ``validation`` is kept only for a VALID status. ``runtime_s`` must be finite;
    it is clipped at 0 and rounded to ``RUNTIME_DECIMALS`` (Python's ``round``)."""
    status = Status(int(status))
    if error_type not in ERROR_TYPES:
        raise ValueError(f"error_type {error_type!r} is not one of {ERROR_TYPES}")
    if status != Status.RUNTIME_ERROR:
        error_type = "none"
    elif error_type == "none":
        error_type = "other"
    if not math.isfinite(float(runtime_s)):
        raise ValueError(f"runtime_s must be finite, got {runtime_s!r}")
    keep = status == Status.VALID
    return Observation(
        status,
        error_type,
        _round_runtime(runtime_s),
        _round_validation(validation) if keep else None,
    )


def observation_of(result: ExecutionResult) -> Observation:
    """A real execution's observation: the result cut to exactly the Observation's fields
    (the test-set score, percentile, reward, stdout and stderr are dropped)."""
    return make_observation(result.status, result.error_type, result.runtime_s, result.validation)


def _format_validation(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.{VALIDATION_DIGITS}g}"


def render_observation(obs: Observation, metric_name: str) -> str:
    """The one template (ASCII, one line, deterministic), for real and WM observations:

    ``status: VALID | error: none | runtime: 3.4s | validation accuracy: 0.84``
    """
    return (
        f"status: {obs.status.name} | error: {obs.error_type} | "
        f"runtime: {obs.runtime_s:.{RUNTIME_DECIMALS}f}s | "
        f"validation {metric_name}: {_format_validation(obs.validation)}"
    )


def static_fields(source: str | bytes, names: bool = True) -> dict:
    """The observation fields known without executing ``source`` (empty dict: none).

    A script that does not compile (``grader.check_script``: empty, not UTF-8, a syntax error)
    is never executed: every field is exact, ``MALFORMED``, "none", 0.0 s, no validation. A
    script that reads a name it never binds (``grader.undefined_names``, with ``names``) is a
    ``RUNTIME_ERROR`` / ``NameError`` with no validation; its runtime is unknown (a script
    that fails on something else before reaching the name is the static check's known
    approximation, as in ``grader.static_outcome``)."""
    data = source.encode("utf-8") if isinstance(source, str) else bytes(source)
    if check_script(data) is not None:
        return {
            "status": Status.MALFORMED,
            "error_type": "none",
            "runtime_s": 0.0,
            "validation": None,
        }
    if names and undefined_names(data.decode("utf-8")):
        return {"status": Status.RUNTIME_ERROR, "error_type": "NameError", "validation": None}
    return {}


def static_observation(
    source: str | bytes, predicted: Observation, names: bool = True
) -> Observation:
    """``predicted`` (a WM observation) with the fields the static check knows overridden
    (``static_fields``)."""
    fields = static_fields(source, names)
    if not fields:
        return predicted
    merged = {**dataclasses.asdict(predicted), **fields}
    return make_observation(**merged)
