"""A forgiving math verifier: the last final answer, cleaned, then compared as mathematics.

DAPO's own scorer (:mod:`dapo_rl.reward.math_dapo`) compares normalised strings, so ``Answer: 540.``,
``**540**``, ``\\frac12`` vs ``0.5`` or a ground truth ``27.0`` vs ``27`` all count as wrong. This verifier
keeps DAPO's reward scale (+1 correct, -1 wrong, arXiv 2503.14476 §2.4) but judges the answer itself:

1. extract the final answer (:func:`~dapo_rl.reward.extract.extract_final_answer`: the later of the last
   "Answer:" line and the last ``\\boxed{}``); a response with neither has no final answer and is wrong.
   ``lenient=True`` (`reward.lenient`, for scoring other models' outputs the way evaluation harnesses do) reads
   such a response instead: a short one whole, a longer one by
   :func:`~dapo_rl.reward.extract.fallback_final_answer` (the last number or math span of its last sentences, as
   Math-Verify falls back to the last expression);
2. clean it (:func:`~dapo_rl.reward.extract.clean_answer`), and the ground truth the same way;
   against a gold that is one option letter, "B) 12" is read as its letter
   (:func:`~dapo_rl.reward.extract.choice_letter`); an answer written as its gold is right here, before any guard;
3. refuse hedges (:func:`~dapo_rl.reward.extract.is_hedged`: "540 or 541") and inputs too large or too deep
   to hand to sympy (length, bracket depth, exponent towers such as ``9^9^9^9``), except that an integer tower
   on either side is compared without sympy first (``65536`` or ``2^{16}`` for ``2^{2^{2^{2}}}``); where the gold
   is an exact rational number (not a decimal), refuse an answer whose value (after its last ``=``) is an
   unevaluated expression of operations (:func:`is_unevaluated_expression`: ``17 \\cdot 23 - 4``,
   ``\\sum_{k=1}^{100} k``, ``2+3``, ``2^{10}``, ``\\sqrt{16}``), which restates the problem instead of solving it (``12 + 5 = 17`` states its value;
   ``lenient=True`` accepts an expression when it evaluates to the gold);
4. lists written with an ellipsis (``1, 3, 5, \\ldots, 2n-1``, also separated by ``;`` or ``:``) compare element
   by element;
5. fast path: equal strings, or two plain numbers / integer fractions: exact values and two decimals compare
   exactly, a decimal against an exact value must be that value correctly rounded to 6+ significant digits;
6. otherwise Math-Verify parses both (``math_verify.parse``); numbers (and tuples and intervals of numbers)
   are compared here, exactly or with a relative tolerance when a decimal takes part (Math-Verify's absolute
   rounding to 6 places calls ``1/2^98`` and ``1/2^99`` equal); anything else goes to ``math_verify.verify``,
   which handles radicals, sets, matrices, equations and relations (an inequality against the interval it
   describes, either way round).

Model output is only parsed, never executed. Nothing here imports torch.
"""

from __future__ import annotations

import math
import re
import threading
import time
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dapo_rl.reward.extract import (
    choice_letter,
    clean_answer,
    extract_final_answer,
    fallback_final_answer,
    gold_final_answer,
    has_open_final_box,
    has_top_level_equation,
    is_hedged,
    last_right_hand_side,
    looks_like_prose,
    nesting_depth,
    split_top_level,
)
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE, ScoreResult, error_result, timeout_result

__all__ = [
    "DECIMAL_REL_TOL",
    "Deadline",
    "EXACT_DIGITS",
    "INVALID_PRED",
    "MAX_ANSWER_CHARS",
    "MAX_EXPONENT_DIGITS",
    "MAX_NESTING_DEPTH",
    "MAX_TOWER_DIGITS",
    "RAW_ANSWER_CHARS",
    "SHORT_RESPONSE_CHARS",
    "answer_is_too_complex",
    "compute_score_math",
    "gsm8k_ground_truth",
    "is_unevaluated_expression",
]

INVALID_PRED = "[INVALID]"
"""``pred`` when a response has no final answer (no "Answer:" line, no box, and longer than 200 chars)."""

SHORT_RESPONSE_CHARS = 200
"""A response with neither "Answer:" nor ``\\boxed{}`` is read whole as its answer when at most this long."""

MAX_ANSWER_CHARS = 1000
"""A cleaned answer longer than this is wrong without parsing (sympy time grows with the input)."""

RAW_ANSWER_CHARS = 4 * MAX_ANSWER_CHARS
"""An extracted answer longer than this is wrong before it is even cleaned."""

MAX_NESTING_DEPTH = 30
"""Answers whose brackets (``([{``) nest deeper than this are wrong without parsing."""

MAX_EXPONENT_DIGITS = 4
"""Answers with a numeric exponent of more digits than this (``10^{12345}``) are wrong without parsing."""

MAX_TOWER_DIGITS = 10_000
"""An integer power tower (``2^{2^{2^{2}}}``) is evaluated, with Python integers, only while every power in it
has at most this many digits; a larger one is compared by how it is written (:func:`_tower_verdict`)."""

DECIMAL_REL_TOL = Fraction(5, 10**6)
"""Relative tolerance when a decimal takes part in a comparison: half a unit in the 6th significant digit, so
``0.333333`` = 1/3 and ``0.0833333333333333`` = 1/12, while ``0.0000001`` != ``0.0000002`` (Math-Verify rounds
both to 6 decimal places, i.e. to 0, and calls them equal)."""

EXACT_DIGITS = 60
"""Exact values (no decimal in either side) are evaluated to this many significant digits and must agree to all
but the last 10 of them: ``1/2^98`` != ``1/2^99`` (Math-Verify's ``evalf(chop=True)`` calls their difference 0)."""

_OPERATION_COMMANDS = (
    "cdot",
    "times",
    "div",
    "ast",
    "frac",
    "dfrac",
    "tfrac",
    "cfrac",
    "sqrt",
    "sum",
    "prod",
    "int",
    "iint",
    "iiint",
    "oint",
    "lim",
    "log",
    "ln",
    "lg",
    "exp",
    "sin",
    "cos",
    "tan",
    "cot",
    "sec",
    "csc",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "binom",
    "dbinom",
    "tbinom",
    "choose",
    "mod",
    "bmod",
    "pmod",
    "max",
    "min",
    "gcd",
    "lcm",
    "operatorname",
    "lfloor",
    "lceil",
    "floor",
    "ceil",
    "over",
)
_OPERATION_COMMAND = re.compile(r"\\(?:" + "|".join(_OPERATION_COMMANDS) + r")(?![A-Za-z])")
_OPERATOR_AFTER_OPERAND = re.compile(
    r"(?<=[\w})\]!.])\s*[-+*/^\u00d7\u00f7\u2212]|[!\u221a\u2211\u220f\u222b]"
)
"""A binary operator after an operand (``2+3``, ``2^{100}``, ``6/2``), a factorial, or a radical, sum, product or
integral sign: a leading sign (``-5``) is not an operation."""

_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big|bigg|Bigg)(?![A-Za-z])")

_CLOCK = re.compile(r"(\d{1,2})\s*:\s*([0-5]\d)\s*(?:([AaPp])\s*\.?\s*[Mm]?\s*\.?)?")
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,3})?")
_INT_FRACTION = re.compile(
    r"([+-]?)\s*(?:\\frac\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))\s*(?:\{\s*([+-]?\d+)\s*\}|(\d))|(\d+)\s*/\s*(\d+))"
)
"""An integer fraction: ``\\frac{3}{4}``, ``\\frac34``, ``3/4``, with a sign."""
_UNSIGNED_INT_FRACTION = re.compile(_INT_FRACTION.pattern.removeprefix(r"([+-]?)\s*"))
_SCIENTIFIC = re.compile(
    r"([+-]?\d+(?:\.\d+)?)\s*(?:\\times|\\cdot|\*|\u00d7)\s*10\s*\^\s*(?:\{\s*([+-]?\d{1,4})\s*\}|([+-]?\d))"
)
"""Scientific notation in LaTeX: ``1.5 \\times 10^{-7}``, ``3 \\cdot 10^8``."""
_POWER_OF_TEN = re.compile(r"([+-]?)10\s*\^\s*(?:\{\s*([+-]?\d{1,4})\s*\}|([+-]?\d))")
_PLAIN_LETTER = re.compile(r"(?<![\\A-Za-z])[A-Za-z]")
_OPENERS = {")": "(", "]": "[", "}": "{"}
_NUMERIC_CHAIN = re.compile(r"\d\s*\}?\s*\^\s*\{?\s*\d+(?:\.\d+)?\s*\}?\s*\^")
_LONG_EXPONENT = re.compile(rf"\^\s*\{{?\s*[+-]?\s*\d{{{MAX_EXPONENT_DIGITS + 1},}}")
_BIG_FACTORIAL = re.compile(rf"\d{{{MAX_EXPONENT_DIGITS + 1},}}\s*!")


class _NeverRaised(BaseException):
    """Stands in for Math-Verify's ``TimeoutException`` if that cannot be imported."""


def gsm8k_ground_truth(answer: str) -> str:
    """The final number of a GSM8K ``answer`` field: the text after ``"#### "``, commas removed.

    Args:
        answer: GSM8K's worked solution, ending in ``"\\n#### 1,234"``.

    Returns:
        The number as written, without thousands separators, e.g. ``"1234"``.

    Raises:
        ValueError: if ``answer`` has no ``"####"`` marker.
    """
    marker = answer.rfind("####")
    if marker == -1:
        raise ValueError("GSM8K answer has no '####' marker")
    return answer[marker + 4 :].strip().replace(",", "")


def _group_before(s: str, end: int) -> str:
    """The operand ending just before ``end``: a bracketed group or a run of digits/letters."""
    i = end - 1
    while i >= 0 and s[i].isspace():
        i -= 1
    if i < 0:
        return ""
    if s[i] in _OPENERS:
        depth = 0
        for j in range(i, -1, -1):
            if s[j] in _OPENERS:
                depth += 1
            elif s[j] in "([{":
                depth -= 1
                if depth == 0:
                    return s[j : i + 1]
        return s[: i + 1]
    j = i
    while j >= 0 and (s[j].isalnum() or s[j] == "."):
        j -= 1
    return s[j + 1 : i + 1]


def _group_after(s: str, start: int) -> str:
    """The operand starting at ``start``: a bracketed group or a run of digits/letters."""
    i = start
    while i < len(s) and s[i].isspace():
        i += 1
    if i >= len(s):
        return ""
    if s[i] in "([{":
        depth = 0
        for j in range(i, len(s)):
            if s[j] in "([{":
                depth += 1
            elif s[j] in ")]}":
                depth -= 1
                if depth == 0:
                    return s[i : j + 1]
        return s[i:]
    j = i
    while j < len(s) and (s[j].isalnum() or s[j] == "."):
        j += 1
    return s[i : max(j, i + 1)]


def _has_numeric_tower(s: str) -> bool:
    """A power whose base or exponent is itself a power (``9^9^9``, ``(9^9)^9``, ``9^{9^9}``), or a factorial
    of a power or factorial (``(9^9)!``, ``(99!)!``), with no variable in it: numbers sympy would expand."""
    for i, ch in enumerate(s):
        if ch == "^":
            operands = _group_before(s, i) + "^" + _group_after(s, i + 1)
        elif ch == "!" and not (i + 1 < len(s) and s[i + 1] == "="):
            operands = _group_before(s, i) + "!"
        else:
            continue
        if operands.count("^") + operands.count("!") >= 2 and not _PLAIN_LETTER.search(operands):
            return True
    # Right-associative chains "9^9^9": the exponent's operand is followed by another "^".
    return _NUMERIC_CHAIN.search(s) is not None


def answer_is_too_complex(answer: str) -> str | None:
    """Cheap guards run before sympy sees a model's answer.

    Args:
        answer: the cleaned answer.

    Returns:
        ``None`` when the answer may be parsed, else the reason: longer than :data:`MAX_ANSWER_CHARS`,
        brackets nested deeper than :data:`MAX_NESTING_DEPTH`, a numeric exponent tower (``9^9^9``,
        ``2^{3^{4}}``), an exponent or factorial argument of more than :data:`MAX_EXPONENT_DIGITS` digits.
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return f"answer longer than {MAX_ANSWER_CHARS} characters"
    if nesting_depth(answer) > MAX_NESTING_DEPTH:
        return f"brackets nested deeper than {MAX_NESTING_DEPTH}"
    if _has_numeric_tower(answer):
        return "numeric exponent tower or nested factorial"
    if _LONG_EXPONENT.search(answer) or _BIG_FACTORIAL.search(answer):
        return f"numeric exponent or factorial of more than {MAX_EXPONENT_DIGITS} digits"
    return None


def _integer_power(s: str) -> tuple[str, int | None] | None:
    """``(canonical form, value)`` of an answer made only of unsigned integers, ``^`` and brackets, else ``None``.

    ``2^{2^{2^{2}}}``, ``2^2^2^2``, ``2^{ 2^{ 2^2 } }`` -> ``("(2^(2^(2^2)))", 65536)``; ``(2^2)^{2}`` ->
    ``("((2^2)^2)", 16)``; ``65536`` -> ``("65536", 65536)``. ``^`` is right-associative; an unbraced exponent is
    one digit, as in LaTeX (``2^16`` is not read). The value is computed with Python integers only while each
    power stays within :data:`MAX_TOWER_DIGITS` digits, else it is ``None`` (``9^{9^{9^{9}}}``), so this never
    hangs. Nothing reaches sympy. Call it only on a string that passed the length and nesting guards.
    """
    text = re.sub(r"\s+", "", s)
    pos = 0

    def power(is_exponent: bool) -> tuple[str, int | None]:
        nonlocal pos
        if pos < len(text) and text[pos] in "{(":
            closer = "}" if text[pos] == "{" else ")"
            pos += 1
            form, value = power(False)
            if pos >= len(text) or text[pos] != closer:
                raise ValueError(s)
            pos += 1
        else:
            digits = re.match(r"\d" if is_exponent else r"\d+", text[pos:])
            if digits is None:
                raise ValueError(s)
            pos += digits.end()
            if is_exponent and pos < len(text) and text[pos].isdigit():
                raise ValueError(s)  # "2^16" is 2^1 then 6 in LaTeX: not read
            form = digits.group(0).lstrip("0") or "0"
            value = int(form) if len(form) <= MAX_ANSWER_CHARS else None
        if pos < len(text) and text[pos] == "^":
            pos += 1
            exp_form, exponent = power(True)
            form, value = f"({form}^{exp_form})", _pow(value, exponent)
        return form, value

    try:
        form, value = power(False)
    except (ValueError, RecursionError):
        return None
    return (form, value) if pos == len(text) else None


def _pow(base: int | None, exponent: int | None) -> int | None:
    """``base ** exponent`` when both are known and the result has at most :data:`MAX_TOWER_DIGITS` digits."""
    if base is None or exponent is None:
        return None
    if base in (0, 1) or exponent == 0:
        return base**exponent
    if exponent.bit_length() > 32 or exponent * math.log10(base) >= MAX_TOWER_DIGITS:
        return None
    return base**exponent


def _tower_verdict(pred: str, gold: str, lenient: bool) -> bool | None:
    """Right / wrong for an answer or a gold that is a numeric power tower (``2^{2^{2^{2}}}``), decided without
    sympy, else ``None`` (the usual path decides).

    The tower guard (:func:`answer_is_too_complex`) keeps sympy away from ``9^9^9^9``, but it must not refuse an
    answer equal to a tower-shaped gold (huggingface/Math-Verify #63). Both sides are read by
    :func:`_integer_power`, or as a plain number (:func:`_as_exact_number`): written the same way
    (``2^2^2^2`` for ``2^{2^{2^{2}}}``, ``9^9^9^9`` for ``9^{9^{9^{9}}}``) they are equal; else their values compare
    while they stay within :data:`MAX_TOWER_DIGITS` digits (``2^{16}``, ``65536``, ``4^{2^{3}}`` for
    ``2^{2^{2^{2}}}``), and a value beyond that is unequal to anything written differently. A tower answer for a
    rational gold is an unevaluated expression (``2^{2^{2}}`` for 16): wrong unless ``lenient``. A tower answer
    that is not read this way stays refused (wrong); a tower gold whose value is too large to compute never
    reaches sympy.
    """
    if pred.count("^") + gold.count("^") < 2 or not _safe_size(pred) or not _safe_size(gold):
        return None  # the guards and the usual path see to these
    pred_tower, gold_tower = _has_numeric_tower(pred), _has_numeric_tower(gold)
    if not pred_tower and not gold_tower:
        return None
    p, g = _tower_number(pred), _tower_number(gold)
    if p is None or g is None:
        if pred_tower:
            return False  # refused, as any tower answer that cannot be evaluated safely
        if g is not None and g[1] is None:
            return False  # a gold too large to compute: only its own spelling matches it
        return None
    (p_form, p_value), (g_form, g_value) = p, g
    if p_form is not None and p_form == g_form:
        return True
    if p_value is None or g_value is None:
        return False
    if p_value != g_value:
        return False
    if p_form is not None and "^" in p_form and g_form is None and _is_rational(gold):
        return lenient  # "2^{2^{2}}" for 16 restates a computation (is_unevaluated_expression)
    return True


def _safe_size(s: str) -> bool:
    return len(s) <= MAX_ANSWER_CHARS and nesting_depth(s) <= MAX_NESTING_DEPTH


def _tower_number(s: str) -> tuple[str | None, Fraction | int | None] | None:
    """``(canonical form, value)`` by :func:`_integer_power` for a power of integers, ``(None, value)`` for another
    plain number (``\\frac{1}{2}``, ``0.5``), else ``None``."""
    if "^" in s:
        found = _integer_power(s)
        if found is not None:
            return found
    number = _as_exact_number(s) if len(s) <= 100 else None
    return None if number is None else (None, number[0])


def is_unevaluated_expression(answer: str) -> bool:
    """Whether a cleaned answer is an expression of operations rather than a number written out.

    Args:
        answer: the cleaned answer (after :func:`~dapo_rl.reward.extract.clean_answer`, which has turned mixed
            numbers into fractions and removed units, thousands separators and ``x =``).

    Returns:
        False for a plain number as :func:`_as_exact_number` reads it (``-387``, ``0.5``, ``\\frac{3}{4}``,
        ``3/4``, ``1.5 \\times 10^{-7}``, ``10^{6}``), also in parentheses (``\\left( \\frac{1}{3} \\right)``),
        and for anything without an operation (``\\{5\\}``, ``B``);
        True when it applies an operation: a binary operator after an operand (``2+3``, ``17 \\cdot 23 - 4``,
        ``2^{100}``), a factorial, or a command such as ``\\sum``, ``\\int``, ``\\sqrt``, ``\\mod``,
        ``\\binom``, ``\\log`` or a ``\\frac`` that is not an integer fraction.

    Used where the gold is an exact rational number, on what follows the answer's last ``=``: a policy trained on such a reward learns to restate the problem's
    expression (review of 2026-12, ../shared/reviews/correctness.md finding 3), which DAPO's own scorer refuses.
    """
    s = _SIZING.sub("", answer).strip()
    while len(s) > 1 and s[0] == "(" and _group_after(s, 0) == s:  # "(\\frac{1}{3})" is the number 1/3
        s = s[1:-1].strip()
    if _as_exact_number(s) is not None:
        return False
    s = _UNSIGNED_INT_FRACTION.sub(
        "1", s
    )  # integer fractions are numbers: "\\frac{1}{2} + \\frac{1}{3}" is a sum
    return bool(_OPERATION_COMMAND.search(s) or _OPERATOR_AFTER_OPERAND.search(s))


def _is_rational(gold: str) -> bool:
    """Whether a cleaned gold is an exact rational number (``387``, ``-\\frac{3}{4}``, ``10^{6}``), not a decimal: the
    golds against which an unevaluated expression is no final answer (a rational can always be written out; a
    decimal gold may stand for an irrational value whose closed form, ``\\frac{\\pi}{2}``, is a fair answer)."""
    number = _as_exact_number(gold)
    return number is not None and number[1] is None


def _as_exact_number(s: str) -> tuple[Fraction, int | None] | None:
    """``(value, decimal places)`` when ``s`` is a plain number, an integer fraction or a number in scientific
    notation, else ``None``.

    The places are those written (``"0.50"`` -> 2, ``"1.5e-7"`` and ``"1.5 \\times 10^{-7}"`` -> 8, ``"2e3"`` -> -3);
    ``None`` for an exact value (an integer, a fraction, ``3 \\cdot 10^8``, ``10^{-7}``).
    """
    compact = s.replace(" ", "")
    if _NUMBER.fullmatch(compact):
        mantissa, _, exponent = compact.lower().partition("e")
        if "." not in mantissa and not exponent:
            return Fraction(compact), None
        places = len(mantissa.partition(".")[2]) - int(exponent or 0)
        return Fraction(compact), places
    stripped = s.strip()
    match = _SCIENTIFIC.fullmatch(stripped)
    if match:
        mantissa, exp = match.group(1), int(match.group(2) or match.group(3))
        value = Fraction(mantissa) * Fraction(10) ** exp
        return value, (len(mantissa.partition(".")[2]) - exp if "." in mantissa else None)
    match = _POWER_OF_TEN.fullmatch(stripped)
    if match:
        value = Fraction(10) ** int(match.group(2) or match.group(3))
        return (-value if match.group(1) == "-" else value), None
    match = _INT_FRACTION.fullmatch(stripped)
    if match:
        sign, num, num1, den, den1, num2, den2 = match.groups()
        if num2 is not None:
            numerator, denominator = int(num2), int(den2)
        else:
            numerator, denominator = int(num or num1), int(den or den1)
        if denominator == 0:
            return None
        value = Fraction(numerator, denominator)
        return (-value if sign == "-" else value), None
    return None


def _decimal_matches(decimal: Fraction, places: int, exact: Fraction) -> bool:
    """Whether a decimal written to ``places`` places is ``exact`` correctly rounded, to 6 significant digits.

    Both must hold: ``exact`` lies within half a unit of the decimal's last written place, and the two agree to
    the relative tolerance :data:`DECIMAL_REL_TOL`. So ``0.333333`` and ``0.0833333333333333`` match 1/3 and 1/12;
    ``0.33`` does not match 1/3 (too few digits) and ``1000000.5`` does not match 1000000 (wrong last place).
    """
    gap = abs(decimal - exact)
    return gap <= Fraction(1, 2) * Fraction(10) ** -places and gap <= DECIMAL_REL_TOL * max(
        abs(decimal), abs(exact)
    )


def _compact(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _clock_time(s: str) -> tuple[int, int, str | None] | None:
    """``(hour, minute, "a"/"p"/None)`` for a clock time such as ``"4:30 p.m."``, else ``None``."""
    match = _CLOCK.fullmatch(s.strip())
    if match is None:
        return None
    hour, minute, half = match.groups()
    return int(hour), int(minute), half.lower() if half else None


def _same_time(a: tuple[int, int, str | None], b: tuple[int, int, str | None]) -> bool:
    """Clock times agree when hour and minute agree and the a.m./p.m. markers do not contradict."""
    return a[:2] == b[:2] and (a[2] is None or b[2] is None or a[2] == b[2])


def _fast_compare(pred: str, gold: str) -> bool | None:
    """True/False when decided without sympy, ``None`` when symbolic comparison is needed."""
    if _compact(pred) == _compact(gold):
        return True
    # Clock times: Math-Verify reads "4:30" as the ratio 4/30 and drops "p.m.", so decide them here.
    pred_time, gold_time = _clock_time(pred), _clock_time(gold)
    if pred_time and gold_time and (pred_time[2] or gold_time[2]):
        return _same_time(pred_time, gold_time)
    a, b = _as_exact_number(pred), _as_exact_number(gold)
    if a is None or b is None:
        return None
    (x, x_places), (y, y_places) = a, b
    if x == y:
        return True
    if (x_places is None) == (y_places is None):
        return False  # two exact values, or two decimals as written ("0.0000001" != "0.0000002")
    if x_places is not None:
        return _decimal_matches(x, x_places, y)
    return _decimal_matches(y, y_places, x)  # type: ignore[arg-type]  # y_places is set: checked above


def _to_latex_input(cleaned: str, raw: str) -> str:
    """The string handed to ``math_verify.parse``: ``$cleaned$``, or the raw text when it is prose."""
    if looks_like_prose(cleaned):
        return _raw_latex_input(raw)
    return f"${cleaned}$"


def _raw_latex_input(raw: str) -> str:
    """The uncleaned answer for Math-Verify's own extraction: wrapped in ``$..$`` unless it has math delimiters."""
    text = raw.replace("\u2212", "-").replace("\\mathrm{e}", "e").replace("\\mathrm{i}", "i").strip()
    if "$" in text or "\\(" in text or "\\[" in text:
        return text
    return f"${text}$"


class Deadline:
    """What is left of one answer's time budget, as Math-Verify's whole-second SIGALRM time-outs.

    Args:
        timeout_s: seconds the whole scoring of one answer may take (`reward.timeout_s`).

    Calling it returns the seconds left, rounded up to a whole second (at least 1), for the next parse or
    comparison, so the last call can overrun the budget by under a second; ``None`` (no time-out) off the main
    thread, where SIGALRM cannot be used, or for a non-positive or infinite budget.

    Raises:
        TimeoutError: when called after the budget is spent.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.active = (
            threading.current_thread() is threading.main_thread()
            and math.isfinite(timeout_s)
            and timeout_s > 0
        )
        self.end = time.monotonic() + timeout_s if self.active else math.inf

    def __call__(self) -> int | None:
        if not self.active:
            return None
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"not settled within {self.timeout_s:g} s")
        return max(1, math.ceil(left))


@lru_cache(maxsize=1)
def _extraction_config() -> tuple[Any, ...]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def _parse(text: str, timeout: int | None) -> list[Any]:
    from math_verify import parse

    return parse(text, extraction_config=_extraction_config(), parsing_timeout=timeout)


_GOLD_CACHE: dict[str, tuple[Any, ...]] = {}
_GOLD_CACHE_SIZE = 4096


def _parse_gold(text: str, timeout: int | None) -> list[Any]:
    """Math-Verify's parse of a gold answer, cached by text (a failed parse is not cached: a time-out must not
    stick); the oldest entry goes when the cache is full."""
    hit = _GOLD_CACHE.get(text)
    if hit is None:
        parsed = _parse(text, timeout)
        if not parsed:
            return []
        if len(_GOLD_CACHE) >= _GOLD_CACHE_SIZE:
            del _GOLD_CACHE[next(iter(_GOLD_CACHE))]
        hit = _GOLD_CACHE[text] = tuple(parsed)
    return list(hit)


def _real_value(expr: Any) -> Any:
    """``expr`` evaluated to :data:`EXACT_DIGITS` digits when it is a finite real number, else ``None``."""
    from sympy import Expr

    if not isinstance(expr, Expr) or not expr.is_number:
        return None
    value = expr.evalf(EXACT_DIGITS)
    if not value.is_Number or not value.is_finite or not value.is_real:
        return None
    return value


def _numeric_verdict(gold: Any, pred: Any, decimal: tuple[str, Fraction, int] | None = None) -> bool | None:
    """Equal / not equal for two parsed numbers (or tuples or intervals of numbers), ``None`` for anything else.

    Exact values compare to :data:`EXACT_DIGITS` significant digits. A decimal on either side compares with the
    relative tolerance :data:`DECIMAL_REL_TOL`, or, when the whole answer on one side is a plain decimal
    (``decimal = (side, value, places)``, side ``"pred"`` or ``"gold"``), by :func:`_decimal_matches`: the exact
    value correctly rounded to the places written. This replaces Math-Verify's absolute rounding
    (``float_rounding=6`` and a chopped ``evalf``), which calls any two values below 1e-6 equal. Tuples compare
    element-wise (same length), intervals by their end points and openness; an "or" of inequalities in one
    variable against a set compares as the union of their solution sets; other sets, relations, symbols and
    complex numbers return ``None`` and are left to Math-Verify.
    """
    from sympy import Float, Interval, Rational, Set, Tuple

    if isinstance(gold, Tuple) and isinstance(pred, Tuple):
        if len(gold) != len(pred):
            return None
        verdicts = [_numeric_verdict(g, p) for g, p in zip(gold, pred)]
        if False in verdicts:
            return False
        return True if all(verdicts) else None
    if isinstance(gold, Interval) and isinstance(pred, Interval):
        if (gold.left_open, gold.right_open) != (pred.left_open, pred.right_open):
            return False
        ends = [_numeric_verdict(gold.start, pred.start), _numeric_verdict(gold.end, pred.end)]
        return False if False in ends else (True if all(ends) else None)
    gold_set, pred_set = _relations_as_set(gold), _relations_as_set(pred)
    if (
        (gold_set is not None or pred_set is not None)
        and isinstance(gold_set or gold, Set)
        and isinstance(pred_set or pred, Set)
    ):
        a_set, b_set = gold_set or gold, pred_set or pred
        return bool(a_set == b_set or a_set.symmetric_difference(b_set).is_empty)
    a, b = _real_value(gold), _real_value(pred)
    if a is None or b is None:
        return None
    if decimal is not None:
        side, value, places = decimal
        exact = a if side == "pred" else b
        return _decimal_matches(value, places, Fraction(str(exact)))
    scale = max(abs(a), abs(b))
    if scale == 0:
        return True
    if gold.has(Float) or pred.has(Float):
        return bool(abs(a - b) <= Rational(DECIMAL_REL_TOL.numerator, DECIMAL_REL_TOL.denominator) * scale)
    return bool(abs(a - b) <= Float(10, EXACT_DIGITS) ** (10 - EXACT_DIGITS) * scale)


def _relations_as_set(expr: Any) -> Any:
    """The solution set of inequalities joined by "or" in one variable (Math-Verify parses ``x < -2 \\text{ or }
    x > 3`` as the set ``{x < -2, x > 3}``): their union, or ``None`` for anything else."""
    from sympy import FiniteSet, Union
    from sympy.core.relational import Relational

    if not isinstance(expr, FiniteSet) or len(expr) < 2:
        return None
    parts = list(expr)
    if not all(isinstance(r, Relational) and len(r.free_symbols) == 1 for r in parts):
        return None
    if len(set().union(*(r.free_symbols for r in parts))) != 1:
        return None
    try:
        return Union(*(r.as_set() for r in parts))
    except Exception:  # sympy cannot solve it: leave it to Math-Verify
        return None


def _first_expression(parsed: list[Any]) -> Any:
    return next((p for p in parsed if not isinstance(p, str)), None)


def _symbolic_equal(
    pred_in: str, gold_in: str, deadline: Deadline, decimal: tuple[str, Fraction, int] | None = None
) -> bool:
    from math_verify import verify
    from math_verify.utils import timeout as with_timeout

    gold_parsed = _parse_gold(gold_in, deadline())
    if not gold_parsed:
        return False
    pred_parsed = _parse(pred_in, deadline())
    if not pred_parsed:
        return False
    verdict = with_timeout(deadline())(_numeric_verdict)(
        _first_expression(gold_parsed), _first_expression(pred_parsed), decimal
    )
    if verdict is not None:
        return verdict
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=deadline(), allow_set_relation_comp=True))


def _lone_decimal(pred: str, gold: str) -> tuple[str, Fraction, int] | None:
    """``(side, value, places)`` when one side is a plain decimal and the other is no plain number at all."""
    a, b = _as_exact_number(pred), _as_exact_number(gold)
    if a is not None and b is None and a[1] is not None:
        return "pred", a[0], a[1]
    if b is not None and a is None and b[1] is not None:
        return "gold", b[0], b[1]
    return None


def _same_tuple(pred: str, gold: str) -> bool | None:
    """Ordered tuples or intervals written with the same brackets, decided from their plain-number elements.

    ``(0, 12.50001)`` vs ``(0, 12.5)``: one element pair of plain numbers differs (compared as
    :func:`_fast_compare` compares them, exactly or by written precision), so the answer is wrong whatever the
    rest; all pairs equal plain numbers: right; otherwise ``None`` (Math-Verify decides). Sets (braces) and lists
    without brackets are left alone: their order does not matter.
    """
    p, g = pred.strip(), gold.strip()
    if len(p) < 2 or len(g) < 2 or (p[0], p[-1]) != (g[0], g[-1]) or p[0] not in "([" or p[-1] not in ")]":
        return None
    if _group_after(p, 0) != p or _group_after(g, 0) != g:  # "(1) + (2)" is not one bracketed tuple
        return None
    pred_parts, gold_parts = split_top_level(p[1:-1]), split_top_level(g[1:-1])
    if len(pred_parts) < 2 or len(pred_parts) != len(gold_parts):
        return None
    verdicts = [
        _fast_compare(a, b) for a, b in zip(pred_parts, gold_parts)
    ]  # False only for differing numbers
    if False in verdicts:
        return False
    return True if all(verdicts) else None


_ELLIPSIS = re.compile(r"\\(?:[lc]?dots[cbi]?|ldotp|cdotp)|\.\.\.|\u2026|\u22ef")
_TERM_THEN_ELLIPSIS = re.compile(r"(.*[\w})\]])\s*(" + _ELLIPSIS.pattern + r")", re.DOTALL)
_CHOICE_GOLD = re.compile(r"[A-Z]")
"""A ground truth that is one option letter: an answer is then read by its letter
(:func:`~dapo_rl.reward.extract.choice_letter`)."""


def _sequence_terms(s: str) -> list[str]:
    """The terms of a list written with an ellipsis, split at top-level ``,``, ``;`` or ``:`` (``1: 2: 3: \\ldots``),
    an ellipsis written onto the term before it counting as its own term (``1, 3, 5 \\ldots`` -> ``1``, ``3``,
    ``5``, ``\\ldots``). Text without an ellipsis is split at ``,`` and ``;`` only (:func:`split_top_level`)."""
    if not _ELLIPSIS.search(s):
        return split_top_level(s)
    parts = split_top_level(s, (",", ";", ":"))
    if len(parts) < 2:
        return parts
    terms: list[str] = []
    for part in parts:
        attached = _TERM_THEN_ELLIPSIS.fullmatch(part)
        if attached and not _ELLIPSIS.fullmatch(part):
            terms.extend([attached.group(1).strip(), attached.group(2)])
        else:
            terms.append(part)
    return terms


def _continues(short: list[str], long: list[str]) -> bool:
    """Whether the longer head of a list (``1, 2, 3`` in ``1, 2, 3, \\ldots, 10``) continues the pattern of the
    shorter one (``1, 2`` in ``1, 2, \\ldots, 10``), which must be its prefix (checked by the caller).

    Plain-number terms only (:func:`_as_exact_number`): two terms set an arithmetic progression, three or more an
    arithmetic or a geometric one, and every further term of the longer head must be its next term (``1, 2,
    \\ldots, 16`` is not ``1, 2, 4, \\ldots, 16``). With any other term (``x_1, x_2``) the prefix is accepted.
    """
    values = [_as_exact_number(t) for t in long]
    if any(v is None for v in values):
        return True
    numbers = [v[0] for v in values]  # type: ignore[index]  # None excluded above
    k = len(short)
    step = numbers[1] - numbers[0]
    if all(numbers[i + 1] - numbers[i] == step for i in range(k - 1)):
        return all(numbers[i + 1] - numbers[i] == step for i in range(len(numbers) - 1))
    if k < 3 or numbers[0] == 0:
        return False
    ratio = numbers[1] / numbers[0]
    return all(numbers[i + 1] == numbers[i] * ratio for i in range(len(numbers) - 1))


def _same_sequence(pred: str, gold: str, deadline: Deadline) -> bool | None:
    """Lists written with an ellipsis (``1, 3, 5, \\ldots, 2n-1``) compared element by element, else ``None``.

    Each list is read as head, ellipsis, tail; terms are separated by commas, semicolons or colons
    (:func:`_sequence_terms`: ``1; 3; 5; \\ldots`` is ``1, 3, 5, \\ldots``). Equal when both have one ellipsis, the
    tails (``2n-1``) are equal element by element, and the heads are too, except that a head of two or more terms
    may be a prefix of the other's where there is a tail and the longer head continues the shorter one's pattern
    (:func:`_continues`): ``1, 2, \\ldots, 10`` is ``1, 2, 3, \\ldots, 10``, but not ``1, 2, 4, \\ldots, 10``, and
    ``2, 4, \\ldots`` is not ``2, 4, 8, \\ldots`` (without a last term two terms do not fix the sequence). Elements
    compare with :func:`_fast_compare`, then Math-Verify. Math-Verify cannot parse such a list: it drops the dots
    or reads the list as one product, so ``1, 3, 5, \\ldots, 2n-1`` "equals" ``1, 2, \\ldots, n``.
    """
    pred_parts, gold_parts = _sequence_terms(pred), _sequence_terms(gold)
    pred_dots = [i for i, p in enumerate(pred_parts) if _ELLIPSIS.fullmatch(p)]
    gold_dots = [i for i, g in enumerate(gold_parts) if _ELLIPSIS.fullmatch(g)]
    if not pred_dots and not gold_dots:
        return None
    if len(pred_dots) != 1 or len(gold_dots) != 1:
        return (
            len(pred_parts) == len(gold_parts)
            and pred_dots == gold_dots
            and _all_equal(
                [(p, g) for i, (p, g) in enumerate(zip(pred_parts, gold_parts)) if i not in gold_dots],
                deadline,
            )
        )
    (pd,), (gd,) = pred_dots, gold_dots
    pred_head, pred_tail = pred_parts[:pd], pred_parts[pd + 1 :]
    gold_head, gold_tail = gold_parts[:gd], gold_parts[gd + 1 :]
    if len(pred_tail) != len(gold_tail):
        return False
    if len(pred_head) != len(gold_head):
        if not pred_tail or min(len(pred_head), len(gold_head)) < 2:
            return False
        shortest, longest = sorted((pred_head, gold_head), key=len)
        if not _continues(shortest, longest):
            return False
        pred_head, gold_head = pred_head[: len(shortest)], gold_head[: len(shortest)]
    return _all_equal(list(zip(pred_head + pred_tail, gold_head + gold_tail)), deadline)


def _all_equal(pairs: list[tuple[str, str]], deadline: Deadline) -> bool:
    for p, g in pairs:
        same = _fast_compare(p, g)
        if same is None:
            same = _symbolic_equal(f"${p}$", f"${g}$", deadline)
        if not same:
            return False
    return True


def _ground_truth_text(ground_truth: Any) -> str:
    if isinstance(ground_truth, bool):
        raise TypeError("ground_truth must be str, int or float, got bool")
    if isinstance(ground_truth, int):
        return str(ground_truth)
    if isinstance(ground_truth, float):
        if not math.isfinite(ground_truth):
            raise ValueError(f"ground_truth is not finite: {ground_truth}")
        # 27.0 -> "27"; 6.02e23 stays "6.02e+23" (int() would spell out its binary rounding error)
        return (
            str(int(ground_truth))
            if ground_truth.is_integer() and abs(ground_truth) < 2**53
            else repr(ground_truth)
        )
    if isinstance(ground_truth, str):
        return ground_truth
    raise TypeError(f"ground_truth must be str, int or float, got {type(ground_truth).__name__}")


def _dedupe_list(answer: str) -> str:
    """``"5, 5"`` -> ``"5"``: a list repeating one value is that value."""
    parts = split_top_level(answer)
    if len(parts) > 1 and len({_compact(p) for p in parts}) == 1:
        return parts[0]
    return answer


def compute_score_math(
    solution_str: str, ground_truth: Any, *, timeout_s: float = 5.0, lenient: bool = False
) -> ScoreResult:
    """Score one response to a math problem on DAPO's ±1 scale, judging the final answer mathematically.

    Steps: extract the final answer (the later of the last "Answer:" line and the last ``\\boxed{}``; a
    response with neither is wrong, or with ``lenient`` read whole when it is at most
    :data:`SHORT_RESPONSE_CHARS` characters, else by its last number or math span of its last sentences,
    :func:`~dapo_rl.reward.extract.fallback_final_answer`;
    the ground truth through :func:`~dapo_rl.reward.extract.gold_final_answer`) -> clean it
    and the ground truth (:func:`~dapo_rl.reward.extract.clean_answer`) -> against a gold that is one capital
    letter, an option letter followed by its text ("B) 12", "(B) 12", "B: 12") is read as the letter
    (:func:`~dapo_rl.reward.extract.choice_letter`) -> an answer equal to the gold as written (whitespace aside)
    is correct, before any guard (``2^{2^{2^{2}}}`` for itself) -> an integer power tower on either side is
    compared by value or spelling without sympy (:func:`_tower_verdict`: ``2^{16}`` for ``2^{2^{2^{2}}}``)
    -> a hedge ("540 or 541", several different values for a single-valued ground truth) is wrong -> guards
    (:func:`answer_is_too_complex`) make over-long, over-nested or exponent-tower answers wrong without parsing -> against a rational gold,
    an unevaluated expression (:func:`is_unevaluated_expression`: ``2+3`` for 5) is wrong unless ``lenient``
    -> lists with an ellipsis
    compare element by element -> equal strings or equal plain numbers are correct (a decimal against an exact
    value: correctly rounded, :data:`DECIMAL_REL_TOL`) -> otherwise both are parsed with Math-Verify (LaTeX and
    plain-expression extraction); two numbers, or tuples / intervals of numbers, are compared exactly
    (:data:`EXACT_DIGITS`) or, with a decimal in either, to :data:`DECIMAL_REL_TOL`; everything else by
    ``math_verify.verify(gold, pred)`` with ``strict=True`` and ``allow_set_relation_comp=True`` (so
    ``0 < x < 12.5`` matches a gold ``(0, 12.5)`` as well as the reverse).

    Time-outs: ``timeout_s`` bounds the whole call (:class:`Deadline`): each Math-Verify parse and comparison
    gets what is left of it as ``parsing_timeout`` / ``timeout_seconds`` (rounded up to whole seconds, since they
    use ``signal.alarm``), and once it is spent the answer is wrong with ``timeout: True``; so a call on the main
    thread ends within ``timeout_s`` plus under a second. SIGALRM only works in the main thread of the main
    interpreter, and Math-Verify raises ``ValueError`` when asked for a time-out elsewhere; so off the main thread
    this function passes ``None`` (no time-out; Math-Verify logs a warning once) and never raises. The alarm also
    replaces any SIGALRM timer the caller had set. There, the hard bound belongs to the caller (the process pool
    kills a worker that overruns, `dapo_rl.reward.pool`).

    Args:
        solution_str: the decoded response (prompt excluded).
        ground_truth: the reference answer: a ``str`` (LaTeX such as ``"\\frac{14}{3}"``, a zero-padded
            ``"025"``, or a solution holding ``\\boxed{}``), an ``int`` or a ``float`` (``27.0`` reads as 27).
        timeout_s: seconds the call may take (default 5).
        lenient: accept what evaluation harnesses accept and training should not reward: a response without
            "Answer:" or a box, read by its last number; an unevaluated expression equal to a rational gold
            (``Answer: 17 \\cdot 23 - 4`` for 387). For scoring other models' outputs; default False, as in
            training (`reward.lenient`).

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str}``: ``pred`` is the cleaned answer, or
        ``"[INVALID]"`` when no answer was found. Never raises: if scoring fails (a non-``str`` response, a
        time-out that escapes Math-Verify) it returns ``score=-1.0``, ``acc=False``, ``pred=""`` and an
        ``error`` key. Refused answers (hedges, guards) are plain wrong answers, without ``error``.

    Source: DAPO (arXiv 2503.14476) §2.4, R(y_hat, y) = 1 if is_equivalent(y_hat, y) else -1.
    """
    try:
        from math_verify.errors import TimeoutException
    except ImportError:  # pragma: no cover - math-verify is a dependency; keep the never-raise contract
        TimeoutException = _NeverRaised  # noqa: N806

    deadline = Deadline(timeout_s)
    try:
        if not isinstance(solution_str, str):
            raise TypeError(f"solution_str must be str, got {type(solution_str).__name__}")
        gold_text = _ground_truth_text(ground_truth)
        raw = extract_final_answer(solution_str)
        if raw is None:
            if not lenient or has_open_final_box(solution_str):  # cut inside its last box: nothing to read
                return {"score": WRONG_SCORE, "acc": False, "pred": INVALID_PRED}
            size = len(solution_str.strip())
            raw = solution_str if 0 < size <= SHORT_RESPONSE_CHARS else fallback_final_answer(solution_str)
            if raw is None:
                return {"score": WRONG_SCORE, "acc": False, "pred": INVALID_PRED}
        if len(raw) > RAW_ANSWER_CHARS:
            return {"score": WRONG_SCORE, "acc": False, "pred": raw[:MAX_ANSWER_CHARS]}
        gold_raw = gold_final_answer(gold_text)
        gold = clean_answer(gold_raw)
        gold_is_equation = has_top_level_equation(gold)
        pred = clean_answer(raw, strip_assignment=not gold_is_equation)
        if _CHOICE_GOLD.fullmatch(gold):
            pred = choice_letter(pred) or pred  # "B) 12" for the option letter B
        # written as the gold: right before any guard ("2^{2^{2^{2}}}" for itself)
        if _compact(pred) == _compact(gold):
            return {"score": CORRECT_SCORE, "acc": True, "pred": pred}
        tower = _tower_verdict(
            pred, gold, lenient
        )  # before the guard: "65536" or "2^{16}" for "2^{2^{2^{2}}}"
        if tower is not None:
            return {
                "score": CORRECT_SCORE if tower else WRONG_SCORE,
                "acc": tower,
                "pred": pred[:MAX_ANSWER_CHARS],
            }
        if answer_is_too_complex(pred) is not None:
            return {"score": WRONG_SCORE, "acc": False, "pred": pred[:MAX_ANSWER_CHARS]}
        if is_hedged(pred, gold):
            return {"score": WRONG_SCORE, "acc": False, "pred": pred}
        pred = _dedupe_list(pred)
        if (
            not lenient
            and _is_rational(gold)
            and is_unevaluated_expression(pred if gold_is_equation else last_right_hand_side(pred))
        ):  # "12 + 5 = 17" states its value; "12 + 5" does not
            return {"score": WRONG_SCORE, "acc": False, "pred": pred}
        correct = _same_sequence(pred, gold, deadline)
        if correct is None:
            correct = _fast_compare(pred, gold)
        if correct is None:
            correct = _same_tuple(pred, gold)
        if correct is None:
            correct = _symbolic_equal(
                _to_latex_input(pred, raw),
                _to_latex_input(gold, gold_raw),
                deadline,
                _lone_decimal(pred, gold),
            )
    except (
        TimeoutError,
        TimeoutException,
    ):  # the budget is spent (Deadline) or a time-out escaped Math-Verify
        return timeout_result(timeout_s)
    except Exception as exc:  # a verifier must never raise on model output
        return error_result(exc)
    return {"score": CORRECT_SCORE if correct else WRONG_SCORE, "acc": bool(correct), "pred": pred}
