"""DAPO's "Answer:" math verifier, with the behaviour of the scorer the paper used.

DAPO (arXiv 2503.14476) prompts the model to end with a line ``Answer: $Answer`` (DAPO-Math-17k answers
are integers) and rewards +1 when that answer equals the ground truth, -1 otherwise (§2.4, rule-based reward
modeling). The published scorer (verl ``utils/reward_score/math_dapo.py``) reads the last "Answer:" line from
the last 300 characters of the response and compares strings after the Minerva normalisation (Lewkowycz et
al. 2022, "Solving Quantitative Reasoning Problems with Language Models", appendix D.1), which the
Hendrycks-MATH harnesses also use.

This module re-implements those semantics, quirks included, so DAPO's reported numbers can be reproduced:

* ``Answer: 540.`` is wrong for ground truth ``540`` (a trailing period is kept, unlike ``$540.$``).
* ``Answer: **540**`` is wrong (Markdown bold is not removed); ``**540**`` with no "Answer:" line is wrong.
* ``\\boxed{540}`` with no "Answer:" line is wrong: boxes are only unwrapped *inside* an "Answer:" line.
* An "Answer:" line that starts more than 300 characters before the end is ignored.
* The pattern is case-insensitive and matches inside words too ("the final answer: 7" counts as an answer
  line), and the space after the colon may include line breaks ("Answer:\\n540" reads "540").
* The normalisation is string surgery, not mathematics: ``1/2`` and ``\\frac{1}{2}`` differ, ``0.5`` and
  ``\\frac12`` differ, a float ground truth ``27.0`` never matches ``27``, and unit words are deleted anywhere
  (``"units"`` inside ``"\\text{units}"``, but also inside other words).

A more forgiving verifier comes separately; this one is for faithful reproduction.
"""

from __future__ import annotations

import re

from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE, ScoreResult, error_result

RESPONSE_WINDOW_CHARS = 300
"""Only this many trailing characters of a response are searched for the answer line (DAPO's scorer)."""

ANSWER_PATTERN = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
"""The answer line of DAPO's prompt template; group 1 is the rest of that line."""

INVALID_PRED = "[INVALID]"
"""``pred`` reported when a response has no "Answer:" line."""

# Literal replacements, applied in this order (Minerva appendix D.1; ``old -> new``).
_SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)

# Units, filler words and TeX spacing deleted wherever they occur, in this order. The entries with "\n" hold a
# real line break, as in the published list.
_REMOVED_EXPRESSIONS: tuple[str, ...] = (
    "square",
    "ways",
    "integers",
    "dollars",
    "mph",
    "inches",
    "hours",
    "km",
    "units",
    "\\ldots",
    "sue",
    "points",
    "feet",
    "minutes",
    "digits",
    "cents",
    "degrees",
    "cm",
    "gm",
    "pounds",
    "meters",
    "meals",
    "edges",
    "students",
    "childrentickets",
    "multiples",
    "\\text{s}",
    "\\text{.}",
    "\\text{\ns}",
    "\\text{}^2",
    "\\text{}^3",
    "\\text{\n}",
    "\\text{}",
    "\\mathrm{th}",
    "^\\circ",
    "^{\\circ}",
    "\\;",
    ",\\!",
    "{,}",
    '"',
    "\\dots",
)

# Regex rewrites after the literal pass, in this order. None of them crosses a line break except where noted.
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = (
    # A line holding two or more "$" keeps only the first inline-math span: "x is $5$ cm" -> "$5$".
    (re.compile(r"[^\n$]*\$([^\n$]*)\$[^\n]*"), r"$\1$"),
    # \text{..}, \textbf{..}, \overline{..}: unwrap up to the first closing brace.
    (re.compile(r"\\text\{([^}\n]*)\}"), r"\1"),
    (re.compile(r"\\textbf\{([^}\n]*)\}"), r"\1"),
    (re.compile(r"\\overline\{([^}\n]*)\}"), r"\1"),
    # \boxed{..}: unwrap up to the last closing brace on the line.
    (re.compile(r"\\boxed\{([^\n]*)\}"), r"\1"),
    # Shorthand TeX: \frac12 -> \frac{1}{2}, \fracabc -> \frac{a}{b}c (the first may be a line break).
    (re.compile(r"frac([^{])(.)"), r"frac{\1}{\2}"),
    # \sqrt2 -> \sqrt{2}, \sqrt23 -> \sqrt{2}3.
    (re.compile(r"sqrt([^{])"), r"sqrt{\1}"),
)


def normalize_final_answer(final_answer: str) -> str:
    """Normalise a final answer string the Minerva / Hendrycks-MATH way, so equal answers compare equal.

    Steps, in order: keep the text after the last "="; apply the literal substitutions (drop "an ", "a ",
    spaces, ``\\$``, ...); delete unit words and TeX spacing; reduce a ``$..$`` line to its math; unwrap
    ``\\text``, ``\\textbf``, ``\\overline`` and ``\\boxed``; expand ``\\frac12`` and ``\\sqrt2`` shorthand;
    drop the remaining "$"; drop the commas of a comma-grouped integer ("1,000" -> "1000"); strip.

    Args:
        final_answer: the answer text, e.g. the rest of an "Answer:" line or a ground truth.

    Returns:
        The normalised string; two answers are judged equal iff their normalised strings are equal.

    Raises:
        AttributeError / TypeError: if ``final_answer`` is not a ``str``.

    Source: Lewkowycz et al. 2022 (Minerva), appendix D.1, as used by DAPO's verl scorer ``math_dapo.py``.
    """
    text = final_answer.split("=")[-1]
    for old, new in _SUBSTITUTIONS:
        text = text.replace(old, new)
    for expression in _REMOVED_EXPRESSIONS:
        text = text.replace(expression, "")
    for pattern, replacement in _REWRITES:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def last_answer_line(text: str, window: int | None = None) -> str | None:
    """Return the content of the last "Answer:" line of a response.

    Args:
        text: the decoded response.
        window: if given, search only the last ``window`` characters (DAPO's scorer uses 300, which also
            drops an answer line that starts before that window).

    Returns:
        The rest of the last line matching ``(?i)Answer\\s*:\\s*([^\\n]+)``, unstripped (it may end in
        spaces or ``"\\r"``), or ``None`` when no line matches.

    Raises:
        TypeError: if ``text`` is not a ``str``.
    """
    if window is not None:
        text = text[-window:]
    matches = ANSWER_PATTERN.findall(text)
    return matches[-1] if matches else None


def compute_score_math_dapo(solution_str: str, ground_truth: str) -> ScoreResult:
    """Score one response with DAPO's "Answer:" verifier.

    The last "Answer:" line in the last 300 characters is normalised with :func:`normalize_final_answer` and
    compared, as a string, with the normalised ground truth. See the module docstring for the known quirks
    (trailing period, bold, ``\\boxed`` without an answer line), kept on purpose.

    Args:
        solution_str: the decoded response (prompt excluded).
        ground_truth: the reference answer; a non-``str`` value (e.g. an ``int``) is converted with ``str()``.

    Returns:
        ``{"score": 1.0 | -1.0, "acc": bool, "pred": str}``; ``pred`` is the normalised prediction, or
        ``"[INVALID]"`` when there is no "Answer:" line (then the answer is always wrong). Never raises: if
        scoring fails (e.g. ``solution_str`` is not a ``str``) it returns ``score=-1.0``, ``acc=False``,
        ``pred=""`` and an ``error`` key.

    Source: DAPO (arXiv 2503.14476) §2.4, R(y_hat, y) = 1 if equivalent else -1; verl
    ``utils/reward_score/math_dapo.py`` (``compute_score`` with ``strict_box_verify=False``).
    """
    try:
        answer = last_answer_line(solution_str, window=RESPONSE_WINDOW_CHARS)
        if answer is None:
            pred, correct = INVALID_PRED, False
        else:
            pred = normalize_final_answer(answer)
            correct = pred == normalize_final_answer(str(ground_truth))
    except Exception as exc:  # a verifier must never raise on model output
        return error_result(exc)
    return {"score": CORRECT_SCORE if correct else WRONG_SCORE, "acc": correct, "pred": pred}
