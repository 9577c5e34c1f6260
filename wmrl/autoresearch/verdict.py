"""The verdict world model's schema, reward, targets and prompt (`wm.kind = "verdict"`).

The paper's world model is the agent's own backbone asked to *predict*, without executing
anything, what the sandbox would report for a script: a JSON verdict of a short `reason` and
one or two `predictions`, each naming

* `status`: malformed, syntax_err, runtime_err, ran_no_sub or valid;
* `error_type` (an exception class) and `error_line` (1-based, 0 = none);
* `quality_bucket`: low, fair, mid or high for a valid submission, empty otherwise;
* `env_feedback`: the text a multi-turn agent would read, and `confidence` in [0, 1].

A second prediction is a hedge: it must name a different status than the first.

Reward (the reference's mapping, exactly): the compile gate comes first, so a script that does
not compile gets 0 whatever the verdict says; otherwise the top prediction's status gives
malformed / syntax_err 0, runtime_err 0.1, ran_no_sub 0.2 and valid `0.5 + 0.5 * pos`, `pos`
0.05 / 0.20 / 0.45 / 0.75 for low / fair / mid / high. A verdict that does not parse under the
schema counts as runtime_err (0.1).

Text decoded by `wmrl.autoresearch.verdict_decoding` always parses; `parse_verdict` is for
text from anywhere else (an endpoint, a hand-written verdict). `real_verdict` writes the
verdict a real outcome deserves (the fine-tuning target and the fidelity yardstick):
percentiles map to buckets at 0.1 / 0.3 / 0.6 and the grader's statuses to the schema's.
`build_prompt` writes the simulator's instructions, the sandbox's environment, the task's
public overview and data inventory and the numbered script, each capped in length; it reads
nothing but the task's `public/` files.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import math
import re

from wmrl.autoresearch.env.grader import Status, check_script
from wmrl.autoresearch.env.task import Task

STATUSES = ("malformed", "syntax_err", "runtime_err", "ran_no_sub", "valid")
BUCKETS = ("low", "fair", "mid", "high")
BUCKET_POS = {"low": 0.05, "fair": 0.20, "mid": 0.45, "high": 0.75}
BUCKET_EDGES = (0.1, 0.3, 0.6)  # a real percentile below 0.1 is low, below 0.3 fair, ...
STATUS_REWARD = {"malformed": 0.0, "syntax_err": 0.0, "runtime_err": 0.1, "ran_no_sub": 0.2}
PARSE_FAILURE_STATUS = "runtime_err"  # what a verdict that does not parse counts as
# The free-text caps, in characters (as the reference caps them); the decoder caps tokens.
REASON_CHARS, ERROR_TYPE_CHARS, FEEDBACK_CHARS = 300, 40, 420
# Every (status, bucket) outcome the scorer weighs: the four buckets of a valid submission
# and each other status with the empty bucket.
OUTCOMES = tuple(("valid", b) for b in BUCKETS) + tuple((s, "") for s in STATUSES if s != "valid")


@dataclasses.dataclass(frozen=True)
class Prediction:
    status: str
    error_type: str = ""
    error_line: int = 0
    quality_bucket: str = ""
    env_feedback: str = ""
    confidence: float = 0.5

    @property
    def reward(self) -> float:
        return outcome_reward(self.status, self.quality_bucket)


@dataclasses.dataclass(frozen=True)
class Verdict:
    reason: str
    predictions: tuple[Prediction, ...]

    @property
    def top(self) -> Prediction:
        return self.predictions[0]

    def to_json(self) -> str:
        """The verdict in the decoder's own layout (`json.dumps`' default separators, the
        schema's key order), so a decoded verdict round-trips to its own text."""
        preds = [dataclasses.asdict(p) for p in self.predictions]
        return json.dumps({"reason": self.reason, "predictions": preds}, ensure_ascii=False)


def outcome_reward(status: str, bucket: str = "") -> float:
    """The reward of one predicted outcome: the ladder for `status`, a valid submission's
    from its bucket's position."""
    if status == "valid":
        return 0.5 + 0.5 * BUCKET_POS[bucket]
    return STATUS_REWARD[status]


def compiles(script: str) -> bool:
    """The compile gate: the pool's own pre-execution check (`grader.check_script`)."""
    return check_script(script.encode("utf-8", "surrogatepass")) is None


def verdict_reward(verdict: Verdict | None, script_compiles: bool) -> float:
    """The reward of a script given its verdict: 0 if it does not compile (whatever the
    verdict), runtime_err's if the verdict did not parse, else the top prediction's."""
    if not script_compiles:
        return 0.0
    if verdict is None:
        return STATUS_REWARD[PARSE_FAILURE_STATUS]
    return verdict.top.reward


def bucket_of(pos: float) -> str:
    """A real leaderboard percentile's bucket (edges 0.1, 0.3, 0.6)."""
    for edge, bucket in zip(BUCKET_EDGES, BUCKETS, strict=False):
        if pos < edge:
            return bucket
    return BUCKETS[-1]


def real_status(status: Status, script: str | None = None) -> str | None:
    """The schema's status for a real outcome; None for UNGRADED (no outcome to learn). A
    MALFORMED script that is text the compiler rejects is syntax_err, any other MALFORMED
    (empty, too large, not UTF-8) malformed; a time-out is a runtime failure, an invalid
    submission one never written."""
    status = Status(status)
    if status == Status.UNGRADED:
        return None
    if status == Status.MALFORMED:
        text = (script or "").strip()
        why = check_script(text.encode("utf-8", "surrogatepass")) if text else None
        syntax = why is not None and why.startswith(("SyntaxError", "ValueError"))
        return "syntax_err" if syntax else "malformed"
    if status in (Status.RUNTIME_ERROR, Status.TIMEOUT):
        return "runtime_err"
    if status in (Status.NO_SUBMISSION, Status.INVALID_SUBMISSION):
        return "ran_no_sub"
    return "valid"


def real_verdict(
    status: Status, reward: float | None, script: str | None = None, error_type: str = "",
    feedback: str = "", reason: str = "",
) -> Verdict | None:  # fmt: skip
    """The one-prediction verdict a real outcome deserves (confidence 1): a VALID's bucket
    from its percentile `pos = 2 * (reward - 0.5)`; None for UNGRADED."""
    name = real_status(status, script)
    if name is None:
        return None
    bucket = bucket_of(2.0 * (float(reward) - 0.5)) if name == "valid" else ""
    pred = Prediction(
        name, error_type[:ERROR_TYPE_CHARS], 0, bucket, feedback[:FEEDBACK_CHARS], 1.0
    )
    return Verdict(reason[:REASON_CHARS], (pred,))


# -- parsing text from outside the sampler -----------------------------------------------


def _prediction(d) -> Prediction | None:
    if not isinstance(d, dict) or d.get("status") not in STATUSES:
        return None
    bucket = d.get("quality_bucket", "")
    if not isinstance(bucket, str) or (bucket and bucket not in BUCKETS):
        return None
    if (d["status"] == "valid") != (bucket in BUCKETS):
        return None  # a bucket is required for valid and forbidden otherwise
    line, conf = d.get("error_line", 0), d.get("confidence", 0.5)
    if isinstance(line, bool) or not isinstance(line, int) or line < 0:
        return None
    if isinstance(conf, bool) or not isinstance(conf, int | float) or not math.isfinite(conf):
        return None
    texts = [d.get(k, "") for k in ("error_type", "env_feedback")]
    if not all(isinstance(t, str) for t in texts):
        return None
    return Prediction(
        d["status"], texts[0][:ERROR_TYPE_CHARS], line, bucket, texts[1][:FEEDBACK_CHARS],
        min(max(float(conf), 0.0), 1.0),
    )  # fmt: skip


def parse_verdict(text: str) -> Verdict | None:
    """The verdict in `text` (a model's answer: a `<think>` block and code fences around the
    JSON object are allowed), or None when it does not match the schema: then the script
    counts as runtime_err. Free text longer than its cap is cut to the cap; a hedge that
    names the top prediction's status again is dropped (the top prediction stands)."""
    text = re.sub(r"<think>.*?</think>", "", text or "", flags=re.S)
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        obj = json.loads(text[start : end + 1])
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("reason", ""), str):
        return None
    preds = obj.get("predictions")
    if not isinstance(preds, list) or not 1 <= len(preds) <= 2:
        return None
    parsed = [_prediction(p) for p in preds]
    if any(p is None for p in parsed):
        return None
    if len(parsed) == 2 and parsed[1].status == parsed[0].status:
        parsed = parsed[:1]
    return Verdict(obj.get("reason", "")[:REASON_CHARS], tuple(parsed))


# -- the prompt ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PromptCaps:
    """Characters per prompt section (the reference caps the overview at 4000 and the code
    at 8000); a section over its cap is cut and says so."""

    overview_chars: int = 4000
    inventory_chars: int = 2000
    script_chars: int = 8000


LIBRARIES = ("numpy", "pandas", "scikit-learn", "scipy")

INSTRUCTIONS = """\
You stand in for a sandbox that runs Python machine-learning scripts, but you never run \
anything: you read the script below and predict what the sandbox and the grader would report \
if it were executed. Work it out by tracing the script against the environment and the data \
inventory: every import, every file it opens, the columns it reads and writes, the shapes \
reaching each estimator, the time its training needs, and what it writes as the submission.

The possible outcomes, from worst to best:
- malformed: there is no script to run (empty, or not Python at all);
- syntax_err: Python refuses to compile it;
- runtime_err: it stops with an exception, or is killed at the time limit;
- ran_no_sub: it finishes but writes no submission, or one the grader rejects (wrong rows, \
ids or columns, values of the wrong kind);
- valid: the grader accepts the submission; then rate its leaderboard position with \
quality_bucket: low (bottom tenth), fair (up to 30%), mid (up to 60%) or high (above).

Answer with one JSON object and nothing else:
{"reason": "<one or two sentences: the cause and its line>", "predictions": [{"status": \
"<outcome>", "error_type": "<the exception class, or empty>", "error_line": <the failing \
line, 0 if none>, "quality_bucket": "<low|fair|mid|high if valid, else empty>", \
"env_feedback": "<what the sandbox would print: the error's last line, or a short run \
summary>", "confidence": <0 to 1>}]}
Give a second prediction only as a hedge, naming a different status; the first is the one \
you believe."""


@functools.cache
def _library_versions() -> str:
    out = []
    for name in LIBRARIES:
        try:
            out.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(out)


def environment_section(time_limit_s: float) -> str:
    """What the sandbox offers a script: the interpreter and libraries this process runs
    (the sandbox runs the same ones), the time limit and the data / submission contract."""
    return (
        f"Python 3 on Linux, CPU only, no network. Installed: {_library_versions()}; "
        "nothing else outside the standard library.\n"
        f"The run is killed after {time_limit_s:g} s.\n"
        "The script reads the task's files from the directory os.environ['DATA_DIR'] "
        "(the files of the inventory below) and must write its predictions as a CSV file "
        "to os.environ['SUBMISSION_PATH']: the id column and the target column, one row per "
        "row of test.csv."
    )


def _cap(text: str, limit: int, what: str) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {what} cut at {limit} characters]"


def _csv_summary(path, sample_rows: int = 50) -> str:
    import pandas as pd

    with open(path, "rb") as f:
        rows = max(sum(1 for _ in f) - 1, 0)
    head = pd.read_csv(path, nrows=sample_rows)
    cols = ", ".join(
        f"{c} ({'number' if pd.api.types.is_numeric_dtype(t) else 'text'}"
        f"{', has missing' if head[c].isna().any() else ''})"
        for c, t in head.dtypes.items()
    )  # fmt: skip
    return f"{rows} rows; columns: {cols}"


def inventory_section(task: Task) -> str:
    """The task's public files (under `public/`, never `private/`): name and size, and for a
    CSV its rows and columns with a type read off its first rows."""
    lines = []
    for path in sorted(p for p in task.public_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(task.public_dir).as_posix()
        line = f"- {rel}: {path.stat().st_size:,} bytes"
        if path.suffix == ".csv":
            try:
                line += "; " + _csv_summary(path)
            except (ValueError, OSError, UnicodeDecodeError) as e:
                line += f" (unreadable as CSV: {type(e).__name__})"
        lines.append(line)
    lines.append(
        f"- the submission: columns {task.id_column}, {task.target}; the metric is "
        f"{task.metric_name}"
    )
    return "\n".join(lines)


def numbered(script: str) -> str:
    """The script with 1-based line numbers, as the sandbox's tracebacks count them."""
    lines = script.split("\n")
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))


def task_sections(task: Task, time_limit_s: float, caps: PromptCaps = PromptCaps()) -> str:
    """The part of the prompt shared by every script of one task (built once per task)."""
    return (
        f"{INSTRUCTIONS}\n\n## Environment\n{environment_section(time_limit_s)}\n\n"
        f"## Task overview\n{_cap(task.card, caps.overview_chars, 'overview')}\n\n"
        f"## Data inventory\n{_cap(inventory_section(task), caps.inventory_chars, 'inventory')}"
    )


def build_prompt(
    task: Task, script: str, time_limit_s: float, caps: PromptCaps = PromptCaps(),
    shared: str | None = None,
) -> str:  # fmt: skip
    """The verdict prompt of `script` on `task` (`shared`: `task_sections` of the task,
    when already built)."""
    head = task_sections(task, time_limit_s, caps) if shared is None else shared
    code = _cap(numbered(script), caps.script_chars, "script")
    return f"{head}\n\n## Script (solution.py)\n{code}\n\n## Your verdict (JSON)\n"
