"""Answer forms that peer verifiers get wrong (issue 29, item 4), one parametrized test per kind.

Users of verl, TRL, OpenRLHF and Math-Verify reported, in 2025-2026, these forms of a final answer scored the
wrong way: (1) a multiple-choice letter followed by its option's text; (2) several answers joined by "and";
(3) angle units such as ``rad`` and scale words ("5 million"); (4) thousands separators inside a ``\\frac``;
(5) ground truths in Python / sympy syntax (``2*pi``, ``sqrt(2)/2``); (6) ``[answer: 42]``; (7) an answer
identical to its gold but large enough to trip the size guard; (8) ``**`` as a Python power rather than Markdown
bold; (9) sequences with an ellipsis under any separator. Every case here was written by hand with its verdict
derived by hand, with right and wrong answers for each kind. All run in the training setting (``lenient=False``)
unless a case says otherwise.
"""

from __future__ import annotations

import pytest

import dapo_rl.reward.math_verifier as math_verifier
from dapo_rl.reward.math_verifier import compute_score_math
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE


def _acc(response: str, ground_truth, *, lenient: bool = False) -> bool:
    result = compute_score_math(response, ground_truth, lenient=lenient)
    assert "error" not in result, result
    assert result["score"] == (CORRECT_SCORE if result["acc"] else WRONG_SCORE)
    return result["acc"]


# --- 1. a multiple-choice letter followed by its option's text ---------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: B: 12", "B", True),
        ("Answer: B: 12", "(B)", True),
        ("\\boxed{B) 12}", "B", True),
        ("\\boxed{B) 12}", "(B)", True),
        ("\\boxed{\\text{(B) } 12}", "B", True),
        ("\\boxed{\\text{(B) } 12}", "(B)", True),
        ("\\boxed{\\textbf{(B)}~12}", "B", True),
        ("Answer: (B) 12", "B", True),
        ("Answer: B. twelve", "B", True),
        ("Answer: B - 12", "B", True),
        ("Answer: **B)** 12", "B", True),
        ("Answer: B", "B", True),
        ("Answer: B.", "(B)", True),
        # the wrong letter stays wrong, with or without its option's text
        ("Answer: C: 12", "B", False),
        ("\\boxed{C) 12}", "(B)", False),
        ("\\boxed{\\text{(C) } 12}", "B", False),
        ("Answer: A. twelve", "B", False),
        ("Answer: D - 12", "B", False),
        ("Answer: C", "B", False),
        # two letters are a hedge, not a letter with its text
        ("Answer: B or C", "B", False),
        ("Answer: B, C", "B", False),
        ("Answer: (B) and (C)", "B", False),
        ("\\boxed{B) 12 \\text{ and } C) 13}", "(C)", False),
        # a number is never read as a letter
        ("Answer: 12.", "12", True),
        ("Answer: 12.", "B", False),
        ("Answer: 12", "13", False),
    ],
)
def test_multiple_choice_letter_with_option_text(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct


# --- 2. several answers joined by "and" ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: the roots are 3 and -2", "3, -2", True),
        ("Answer: the roots are 3 and -2", "-2, 3", True),
        ("Answer: x = 3 and x = -2", "3, -2", True),
        ("Answer: x = 3 and x = -2", "-2, 3", True),
        ("Answer: 3 and -2", "3, -2", True),
        ("Answer: 3 and -2", "-2, 3", True),
        ("Answer: -2 and 3", "3, -2", True),
        ("\\boxed{3 \\text{ and } -2}", "-2, 3", True),
        ("Answer: $x = 3$ and $x = -2$", "-2, 3", True),
        # a different set
        ("Answer: the roots are 3 and 2", "3, -2", False),
        ("Answer: x = 3 and x = 2", "-2, 3", False),
        ("Answer: 3 and -3", "3, -2", False),
        ("Answer: 3 and -2 and 5", "3, -2", False),
        # one of the two values
        ("Answer: 3", "3, -2", False),
        ("Answer: x = -2", "-2, 3", False),
        ("Answer: the root is 3", "3, -2", False),
    ],
)
def test_answers_joined_by_and(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct


# --- 3. angle units and scale words --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: \\frac{\\pi}{2} rad", "\\frac{\\pi}{2}", True),
        ("Answer: \\frac{\\pi}{2}\\text{ rad}", "\\frac{\\pi}{2}", True),
        ("Answer: \\frac{\\pi}{2}\\,\\text{radians}", "\\frac{\\pi}{2}", True),
        ("Answer: \\pi \\text{ rad}", "\\pi", True),
        ("Answer: 2\\pi rad", "2\\pi", True),
        ("Answer: 2 rad", "2", True),
        ("Answer: 2\\text{ rad}", "2", True),
        ("Answer: \\frac{\\pi}{3} rad", "\\frac{\\pi}{2}", False),
        ("Answer: 3 rad", "2", False),
        ("Answer: \\pi \\text{ rad}", "2\\pi", False),
        # scale words multiply, never vanish
        ("Answer: 5 million", "5", False),
        ("Answer: 5 million", "5000000", True),
        ("Answer: 5 million", 5000000, True),
        ("Answer: the population is 5 million", "5000000", True),
        ("Answer: the population is 5 million", "5", False),
        ("Answer: 5\\text{ million}", "5000000", True),
        ("Answer: 2.5 million", "2500000", True),
        ("Answer: 2.5 million", "2.5", False),
        ("Answer: 3 thousand", "3000", True),
        ("Answer: 3 thousand", "3", False),
        ("Answer: 3 thousand", "30000", False),
        ("Answer: 1,500 million", "1500000000", True),
        ("Answer: 1,500 million", "1500", False),
        ("Answer: \\$4 billion", "4000000000", True),
        ("Answer: 4 billion dollars", "4000000000", True),
        ("Answer: 4 billion", "4", False),
        ("Answer: 4 billion", "4000000", False),
        ("Answer: 5000000", "5 million", True),
        ("Answer: 5", "5 million", False),
    ],
)
def test_angle_units_and_scale_words(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct


# --- 4. thousands separators inside a fraction ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: \\frac{1,000}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\frac{1{,}000}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\frac{1\\,000}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\frac{1\\!000}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\frac{1\u2009000}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\frac{\\mathrm{1,000}}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\frac{\\text{1,000}}{3}", "\\frac{1000}{3}", True),
        ("Answer: \\dfrac{12,345,678}{7}", "\\frac{12345678}{7}", True),
        ("Answer: \\frac{3}{1,000}", "\\frac{3}{1000}", True),
        ("Answer: \\frac{3}{1{,}000}", "0.003", True),
        ("Answer: \\frac{1000}{3}", "\\frac{1{,}000}{3}", True),
        ("Answer: \\frac{1,000}{3}", "\\frac{1001}{3}", False),
        ("Answer: \\frac{1{,}000}{7}", "\\frac{1000}{3}", False),
        ("Answer: \\frac{3}{1,000}", "\\frac{3}{100}", False),
        # "1,5" is not a thousands separator: the fraction is not 15/3 = 5, nor 1000/3
        ("Answer: \\frac{1,5}{3}", "\\frac{15}{3}", False),
        ("Answer: \\frac{1,5}{3}", "5", False),
        ("Answer: \\frac{1,5}{3}", "\\frac{1000}{3}", False),
    ],
)
def test_thousands_separators_in_fractions(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct


# --- 5. ground truths in Python / sympy syntax ------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: 2\\pi", "2*pi", True),
        ("Answer: 2 \\pi", "2*pi", True),
        ("Answer: \\pi", "2*pi", False),
        ("Answer: 2", "2*pi", False),
        ("Answer: \\frac{\\pi}{2}", "pi/2", True),
        ("Answer: \\frac{\\pi}{3}", "pi/2", False),
        ("Answer: \\frac{\\sqrt{2}}{2}", "sqrt(2)/2", True),
        ("Answer: \\frac{1}{\\sqrt{2}}", "sqrt(2)/2", True),
        ("Answer: \\frac{\\sqrt{3}}{2}", "sqrt(2)/2", False),
        ("Answer: 9", "3**2", True),
        ("Answer: 3^2", "3**2", True),
        ("Answer: 6", "3**2", False),
        ("Answer: 2\\sqrt{3}", "2*sqrt(3)", True),
        ("Answer: \\sqrt{12}", "2*sqrt(3)", True),
        ("Answer: 3\\sqrt{2}", "2*sqrt(3)", False),
        # the same syntax in a response reads the same way
        ("Answer: 2*pi", "2\\pi", True),
        ("Answer: sqrt(2)/2", "\\frac{\\sqrt{2}}{2}", True),
        ("Answer: pi/3", "\\frac{\\pi}{2}", False),
    ],
)
def test_python_syntax_ground_truths(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct


# --- 6. an answer in square brackets after a lead-in -----------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("The sum is computed above.\n[answer: 42]", "42", True),
        ("[Answer: 42]", "42", True),
        ("[ANSWER: 42]", "42", True),
        ("So we are done.\n[final answer: 42]", "42", True),
        ("[Final Answer: 42].", "42", True),
        ("[answer: \\frac{1}{2}]", "0.5", True),
        ("[answer: [0, 1)]", "[0,1)", True),
        ("[answer: 41]", "42", False),
        ("[ANSWER: 43]", "42", False),
        ("[final answer: 4]", "42", False),
        ("[answer: 42]\nWait, that is wrong.\nAnswer: 41", "42", False),
    ],
)
def test_answer_in_square_brackets(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct


# --- 7. an answer identical to its gold but refused by the size guard ----------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: 2^{2^{2^{2}}}", "2^{2^{2^{2}}}", True),
        ("\\boxed{2^{2^{2^{2}}}}", "2^{ 2^{ 2^{2} } }", True),
        ("Answer: $10^{12345}$", "10^{12345}", True),
        ("Answer: 9^{9^{9}}", "9^{9^{9}}", True),
        ("Answer: 2^{2^{2^{3}}}", "2^{2^{2^{2}}}", False),
        ("Answer: 10^{12346}", "10^{12345}", False),
        ("Answer: 9^{9^{8}}", "9^{9^{9}}", False),
    ],
)
def test_identical_answer_beyond_the_size_guard(response, ground_truth, correct, monkeypatch):
    def no_sympy(*_args, **_kwargs):
        raise AssertionError("the guard must decide without parsing")

    monkeypatch.setattr(math_verifier, "_parse", no_sympy)
    assert _acc(response, ground_truth) is correct


# --- 8. "**" as a Python power, not Markdown bold ---------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "lenient", "correct"),
    [
        ("Answer: 2**10", "1024", False, False),  # an unevaluated power against a plain number (training)
        ("Answer: 2**10", "1024", True, True),
        ("Answer: 2**10", "210", False, False),  # never read as the digits "210"
        ("Answer: 2**10", "210", True, False),
        ("Answer: 2**10", "2^{10}", False, True),
        ("Answer: **42**", "42", False, True),
        ("Answer: **42**", "42", True, True),
        ("Answer: **42**", "4242", False, False),
        ("Answer: 2 ** 10", "2^{10}", False, True),
        # read as bold, "2**3 + 2**2" would be "23 + 22" = 45
        ("Answer: 2**3 + 2**2", "12", True, True),
        ("Answer: 2**3 + 2**2", "45", True, False),
        ("Answer: x**2", "x^2", False, True),
        ("Answer: x**2", "x^3", False, False),
        ("Answer: x**2", "2x", False, False),
        ("Answer: 3*x**2 + 1", "3x^2+1", False, True),
    ],
)
def test_double_star_is_a_power_not_bold(response, ground_truth, lenient, correct):
    assert _acc(response, ground_truth, lenient=lenient) is correct


# --- 9. sequences with an ellipsis under any separator ----------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: 1; 3; 5; \\ldots", "1, 3, 5, \\ldots", True),
        ("Answer: 1, 3, 5, \\dots", "1, 3, 5, \\ldots", True),
        ("Answer: 1, 3, 5, ...", "1, 3, 5, \\ldots", True),
        ("Answer: 1, 3, 5, \\cdots", "1; 3; 5; \\ldots", True),
        ("Answer: 1: 2: 3: \\ldots", "1, 2, 3, \\ldots", True),
        ("Answer: 1, 3, 5 \\ldots", "1, 3, 5, \\ldots", True),
        ("Answer: 1; 3; 5...", "1, 3, 5, \\ldots", True),
        ("Answer: 1: 2: 3: \\ldots", "1, 2, 4, \\ldots", False),
        ("Answer: 1; 3; 7; \\ldots", "1, 3, 5, \\ldots", False),
        ("Answer: 2, 4, \\ldots", "2, 4, 8, \\ldots", False),
        ("Answer: 2, 4, 8, \\ldots", "2, 4, \\ldots", False),
        ("Answer: 1, 3, 5", "1, 3, 5, \\ldots", False),
        ("Answer: 1, 2, \\ldots, 10", "1, 2, 3, \\ldots, 10", True),
        ("Answer: 1; 2; \\ldots; 10", "1, 2, 3, \\ldots, 10", True),
        ("Answer: 1, 2, \\ldots, 11", "1, 2, 3, \\ldots, 10", False),
        # a head that does not continue the other's pattern: 1, 2, ... (every integer) vs 1, 2, 4, ... (powers of 2)
        ("Answer: 1, 2, \\ldots, 16", "1, 2, 4, \\ldots, 16", False),
        ("Answer: 1, 2, 4, \\ldots, 16", "1, 2, \\ldots, 16", False),
        ("Answer: 1, 3, \\ldots, 2n-1", "1, 3, 5, \\ldots, 2n-1", True),
        ("Answer: 1, 3, 5, \\ldots, 2n-1", "1, 2, \\ldots, n", False),
    ],
)
def test_sequences_with_an_ellipsis(response, ground_truth, correct):
    assert _acc(response, ground_truth) is correct
