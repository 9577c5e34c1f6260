"""How ids and class labels are compared: one canonical form per cell (`canonical_id`).

Its own module because both sides need it: the task format (`task.py` refuses an id column
whose canonical forms collide) and the grader (`grader.py` matches submitted ids to the
hidden ones by it).
"""

from __future__ import annotations

import re

# An ASCII decimal number: optional sign, digits with an optional point and fraction (or a
# point and digits), optional exponent. float() would also take "١" (Arabic-Indic one),
# "1_0", "inf" or "nan", making distinct id strings the same id. Unambiguous: every run of
# digits is followed by something that is not a digit, so a failing match gives each
# character back at most once (linear time). The older spelling ``\d+\.?\d*`` split a run
# of digits between two loops in every possible way: quadratic, 30,000 digits and a letter
# took 30 s.
NUMBER = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<int>\d+)(?:\.(?P<frac>\d*))?|\.(?P<point_frac>\d+))"
    r"(?:[eE](?P<exp>[+-]?\d+))?",
    re.ASCII,
)

# The longest id, target or prediction cell a submission may hold, in characters. Real cells
# are short (a float prints in at most 24); the cap bounds every per-cell step of grading
# whatever a submission holds, and a task's own ids and labels must respect it too.
MAX_CELL_CHARS = 1000


def canonical_id(cell: str) -> str:
    """The form in which ids and class labels are compared: two cells name the same id (or
    class) exactly when their canonical forms are equal.

    Surrounding whitespace never counts. A cell that is an ASCII decimal number (``NUMBER``)
    stands for its exact value, computed on its digits, with no float round trip (so 2**53
    and 2**53 + 1 stay distinct); any other cell stands for itself. A value is written in
    plain decimal with no "+", no leading zeros and no trailing zeros after the point:
    "007", "+7", "7.0", "7.00", "0.7e1" and "70E-1" are all "7" (pandas writes an integer
    id column it read as floats as "7.0"), "-0.0" is "0", "0.50", ".5" and "5e-1" are
    "0.5", "1e3" is "1000". A value whose plain form would have more than MAX_CELL_CHARS
    digits is written as mantissa and exponent instead ("1e5000", "-2.5e-4000").

    Raises ValueError for a cell longer than MAX_CELL_CHARS: the grader refuses such a
    submission cell before it gets here, and a task whose own ids or labels are that long
    cannot be graded.
    """
    if len(cell) > MAX_CELL_CHARS:
        raise ValueError(f"a cell of {len(cell):,} characters (at most {MAX_CELL_CHARS:,})")
    text = cell.strip()
    if text.isascii() and text.isdecimal() and (text[0] != "0" or len(text) == 1):
        return text  # the commonest id, a plain decimal integer, is its own form
    m = NUMBER.fullmatch(text)
    if m is None:
        return text
    frac = m["frac"] or m["point_frac"] or ""
    digits = ((m["int"] or "") + frac).lstrip("0")
    if not digits:
        return "0"
    significant = digits.rstrip("0")
    exp = int(m["exp"] or "0") - len(frac) + len(digits) - len(significant)
    return ("-" if m["sign"] == "-" else "") + _decimal_text(significant, exp)


def _decimal_text(digits: str, exp: int) -> str:
    """``digits`` * 10**``exp`` (digits without leading or trailing zeros) in plain decimal,
    or as mantissa and exponent where the plain form would exceed MAX_CELL_CHARS digits."""
    point = len(digits) + exp  # where the decimal point goes, counted from the first digit
    if max(point, len(digits), 1 - exp) > MAX_CELL_CHARS:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e{point - 1}"
    if exp >= 0:
        return digits + "0" * exp
    if point > 0:
        return digits[:point] + "." + digits[point:]
    return "0." + "0" * -point + digits
