"""Three kinds of math-verifier errors reported publicly against peer verifiers, one section per kind.

(1) A response cut inside its last ``\\boxed{`` (at the length limit) let an earlier, complete box win
    (marin-community/marin PR #9163); here it has no final answer. (2) Golds written in sympy / Python syntax
    (``sin(x)*2``, ``ln(2)``, ``sqrt(2)/2``) did not match the same answer in LaTeX (scitix/sieval PR #90). (3) The
    power-tower guard refused an answer identical or equal to a tower-shaped gold (huggingface/Math-Verify #63).

Every case is hand-written, with its verdict derived by hand, and runs the real verifier (no mocks) in the
training setting (``lenient=False``) unless a case says otherwise.
"""

from __future__ import annotations

import time

import pytest

from dapo_rl.reward.extract import clean_answer, extract_final_answer, has_open_final_box
from dapo_rl.reward.math_verifier import INVALID_PRED, compute_score_math
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE


def _score(response: str, ground_truth, *, lenient: bool = False) -> dict:
    result = compute_score_math(response, ground_truth, lenient=lenient)
    assert "error" not in result, result
    assert result["score"] == (CORRECT_SCORE if result["acc"] else WRONG_SCORE)
    return result


# --- 1. a response cut inside its last box ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth"),
    [
        ("So \\boxed{12} is wrong, actually the answer is \\boxed{1", "12"),
        ("So \\boxed{12} is wrong, actually the answer is \\boxed{1", "1"),  # "\\boxed{1" may have been 125
        ("First guess \\boxed{\\frac{1}{2}}. Checking again: \\boxed{\\frac{1}{2", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2", "\\frac{1}{2}"),
        ("Answer: 12\n\nHmm, wait. Let me redo this: \\boxed{1", "12"),  # the open box comes after the line
        ("\\boxed{12} and \\boxed{13} or maybe \\fbox{14", "12, 13"),
        ("Answer: \\boxed{12", "12"),  # the answer line itself was cut inside its box
        # cut right after the box command, before its brace: the earlier box does not win either
        ("\\boxed{12} hmm \\boxed", "12"),
        ("\\boxed{12} hmm \\boxed ", "12"),
        ("\\boxed{12} hmm \\boxed\n\n", "12"),
        ("\\boxed{12} hmm \\fbox", "12"),
        ("Answer: 12\n\nWait, let me box it: \\boxed", "12"),
    ],
)
def test_open_final_box_is_no_answer(response, ground_truth):
    """An unterminated last box means the response has no final answer: -1 like a response without one, in
    training and with ``lenient`` (whose last-number fallback would read the cut "1" of ``\\boxed{1``)."""
    assert has_open_final_box(response)
    assert extract_final_answer(response) is None
    for lenient in (False, True):
        assert _score(response, ground_truth, lenient=lenient) == {
            "score": WRONG_SCORE,
            "acc": False,
            "pred": INVALID_PRED,
        }


@pytest.mark.parametrize(
    ("response", "ground_truth", "pred", "correct"),
    [
        # an "Answer:" line after the open box is the final answer
        ("Maybe \\boxed{1\n\nAnswer: 12", "12", "12", True),
        ("Maybe \\boxed{1\n\nAnswer: 13", "12", "13", False),
        # a complete box after an open one is the final answer
        ("Let \\boxed{1 be... no. The answer is \\boxed{12}.", "12", "12", True),
        # every box closed: unchanged, the last one wins
        ("So \\boxed{12} is wrong, actually the answer is \\boxed{1}", "1", "1", True),
        ("So \\boxed{12} is wrong, actually the answer is \\boxed{1}", "12", "1", False),
        # nested braces that all close are no open box
        ("\\boxed{\\frac{1}{2}}", "0.5", "\\frac{1}{2}", True),
        # an unbalanced brace in the prose before the box does not open the box
        ("The set {1, 2 has two elements, so \\boxed{2}", "2", "2", True),
        # a box command in the middle of the text, or glued to a word, is no cut box
        ("I use \\boxed to mark it: \\boxed{12}", "12", "12", True),
        ("\\boxed{12} and \\boxedx", "12", "12", True),
        ("\\boxed 12", "12", "12", True),
    ],
)
def test_answer_after_open_box_still_counts(response, ground_truth, pred, correct):
    assert not has_open_final_box(response)
    assert _score(response, ground_truth) == {
        "score": CORRECT_SCORE if correct else WRONG_SCORE,
        "acc": correct,
        "pred": pred,
    }


def test_open_box_at_the_end_of_a_long_truncated_response_scores_like_no_answer():
    """A DAPO-length response cut at its limit inside ``\\boxed{`` after an earlier right box: -1, as a response
    without an answer is."""
    long = (
        "We check each case. " * 400
        + "So \\boxed{540} is a candidate. On reflection the answer is \\boxed{54"
    )
    assert _score(long, "540") == {"score": WRONG_SCORE, "acc": False, "pred": INVALID_PRED}
    no_answer = "We check each case. " * 400 + "So the answer is 540"
    assert _score(no_answer, "540") == _score(long, "540")


# --- 2. golds in sympy / Python syntax -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: $2\\sin x$", "sin(x)*2", True),
        ("Answer: $2\\sin(x)$", "sin(x)*2", True),
        ("Answer: 2*sin(x)", "2\\sin x", True),  # the same rewriting reads a plain-text answer
        ("Answer: $\\sin x$", "sin(x)*2", False),
        ("Answer: $2\\cos x$", "sin(x)*2", False),
        ("Answer: $\\ln 2$", "ln(2)", True),
        ("Answer: $\\ln 2$", "log(2)", True),  # sympy's log is the natural logarithm
        ("Answer: $\\ln 3$", "ln(2)", False),
        ("Answer: $\\log_{10} 2$", "log(2)", False),
        ("Answer: $\\frac{1}{2}$", "0.5", True),
        ("Answer: $\\frac{1}{3}$", "0.5", False),
        ("Answer: $\\frac{\\sqrt{2}}{2}$", "sqrt(2)/2", True),
        ("Answer: $\\frac{\\sqrt{3}}{2}$", "sqrt(2)/2", False),
        ("Answer: $x^2$", "x**2", True),
        ("Answer: $x^3$", "x**2", False),
        ("Answer: $\\frac{\\pi}{4}$", "pi/4", True),
        ("Answer: $\\frac{\\pi}{3}$", "pi/4", False),
        ("Answer: $e^{2x}$", "exp(2*x)", True),
        ("Answer: $\\frac{\\pi}{6}$", "asin(1/2)", True),
        ("Answer: $(-\\infty, 1)$", "(-oo, 1)", True),
        ("Answer: $(-\\infty, 2)$", "(-oo, 1)", False),
    ],
)
def test_sympy_syntax_gold_matches_latex_answer(response, ground_truth, correct):
    assert _score(response, ground_truth)["acc"] is correct


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: $[1, 3]$", "[1, 3]", True),
        ("Answer: $1 \\le x \\le 3$", "[1, 3]", True),
        ("Answer: $\\{1, 3\\}$", "[1, 3]", False),
        ("Answer: $1, 3$", "[1, 3]", False),
        ("Answer: $(1, 3)$", "[1, 3]", False),
        ("Answer: $\\{1, 2, 3\\}$", "[1, 2, 3]", True),
        ("Answer: $1, 2, 3$", "[1, 2, 3]", True),
        ("Answer: $1, 2, 4$", "[1, 2, 3]", False),
    ],
)
def test_bracketed_gold_is_an_interval_with_two_elements_and_a_list_with_more(
    response, ground_truth, correct
):
    """Choice: a gold ``[a, b]`` stays the closed interval from a to b, as the verifier and Math-Verify's LaTeX
    parser read it (``Interval(1, 3)``) and as MATH writes ranges; so the set ``\\{1, 3\\}`` and the list ``1, 3``
    are wrong against ``[1, 3]`` (for a range question they are wrong answers, and a Python list of two values
    cannot be told apart from the interval). A bracketed gold of three or more elements cannot be an interval
    and is a list (Math-Verify: a tuple), which matches the same values as a set or a bare list."""
    assert _score(response, ground_truth)["acc"] is correct


@pytest.mark.parametrize(
    ("gold", "latex"),
    [
        ("sin(x)*2", "\\sin(x)*2"),
        ("ln(2)", "\\ln(2)"),
        ("log(x+1)", "\\ln(x+1)"),
        ("sqrt(2)/2", "\\sqrt{2}/2"),
        ("sqrt(sqrt(2))", "\\sqrt{\\sqrt{2}}"),
        ("x**2", "x^{2}"),
        ("pi/4", "\\pi/4"),
        ("exp(2*x)", "e^{2*x}"),
        ("asin(1/2)", "\\arcsin(1/2)"),
        ("(-oo, 1)", "(-\\infty, 1)"),
        ("sqrt(2", "sqrt(2"),  # never closed: left as written
        ("\\sin(x)", "\\sin(x)"),  # LaTeX already: untouched
        ("using", "using"),  # a word is no function call
    ],
)
def test_sympy_syntax_is_rewritten_as_latex_text(gold, latex):
    """The rewriting is string code only: the result goes to the LaTeX parser, never to sympy's ``parse_expr``."""
    assert clean_answer(gold) == latex


# --- 3. answers equal to a power-tower gold -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "ground_truth", "correct"),
    [
        ("Answer: $2^{2^{2^{2}}}$", "2^{2^{2^{2}}}", True),
        ("Answer: $2^2^2^2$", "2^{2^{2^{2}}}", True),  # right-associative, as written in the gold
        ("Answer: $2^{16}$", "2^{2^{2^{2}}}", True),
        ("Answer: $65536$", "2^{2^{2^{2}}}", True),
        ("Answer: $4^{2^{3}}$", "2^{2^{2^{2}}}", True),  # 4^8 = 65536
        ("Answer: $65537$", "2^{2^{2^{2}}}", False),
        ("Answer: $2^{2^{2}}$", "2^{2^{2^{2}}}", False),  # 16
        ("Answer: $(2^2)^{2^2}$", "2^{2^{2^{2}}}", False),  # 256
        ("Answer: $2^{2^{2^{3}}}$", "2^{2^{2^{2}}}", False),  # 2^256
        ("Answer: $9^9^9^9$", "9^{9^{9^{9}}}", True),  # too large to evaluate: the same tower as written
        ("Answer: $9^{9^{9^{8}}}$", "9^{9^{9^{9}}}", False),
        ("Answer: $5$", "9^{9^{9^{9}}}", False),  # the gold never reaches sympy
        ("Answer: $x^2$", "9^{9^{9^{9}}}", False),
    ],
)
def test_answer_equal_to_a_tower_gold_is_right(response, ground_truth, correct):
    start = time.monotonic()
    assert _score(response, ground_truth)["acc"] is correct
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    ("response", "ground_truth"),
    [
        ("Answer: $9^{9^{9^{9}}}$", "5"),
        ("Answer: $9^9^9^9$", "387420489"),
        ("Answer: $9^{9^{9^{9}}}$", "2^{2^{2^{2}}}"),
        ("Answer: $(9^9)!$", "5"),
        ("Answer: $2^{2^{100000}}$", "4"),
        ("Answer: $10^{10^{10^{10}}}$", "10^{10^{10}}"),
    ],
)
def test_tower_answer_for_a_gold_it_does_not_equal_is_wrong_at_once(response, ground_truth):
    start = time.monotonic()
    for lenient in (False, True):
        assert _score(response, ground_truth, lenient=lenient)["acc"] is False
    assert time.monotonic() - start < 2.0


def test_tower_answer_for_a_rational_gold_is_an_unevaluated_expression():
    """``2^{2^{2}}`` for 16 restates a computation: wrong in training, right with ``lenient`` (as ``2^{4}`` is)."""
    assert _score("Answer: $2^{2^{2}}$", "16")["acc"] is False
    assert _score("Answer: $2^{2^{2}}$", "16", lenient=True)["acc"] is True
    assert _score("Answer: $2^{2^{2}}$", "17", lenient=True)["acc"] is False


def test_math_dapo_reads_answer_lines_only_so_a_cut_box_changes_nothing():
    """DAPO's reference scorer never reads a box outside its "Answer:" line, so it has no earlier box to let win: a
    trailing bare ``\\boxed`` leaves its verdict as the reference gives it."""
    from dapo_rl.reward.math_dapo import compute_score_math_dapo

    assert compute_score_math_dapo("\\boxed{12} hmm \\boxed", "12") == {
        "score": WRONG_SCORE,
        "acc": False,
        "pred": "[INVALID]",
    }
    got = compute_score_math_dapo("Answer: 12\n\nWait, let me box it: \\boxed", "12")
    assert got["acc"] is True and got["score"] == CORRECT_SCORE and got["pred"] == "12"


def test_a_reference_solution_ending_in_a_bare_box_command_keeps_its_answer():
    """References are never cut at a length limit: the open-final-box rule is for responses (review of this change,
    m2: a gold ending in a bare `\\boxed` lost its answer to the whole text)."""
    from dapo_rl.reward.extract import extract_final_answer, gold_final_answer

    assert gold_final_answer("Thus the answer is $\\boxed{5}$. We used \\boxed") == "5"
    assert gold_final_answer("$\\boxed{12}$ \\fbox") == "12"
    assert extract_final_answer("$\\boxed{12}$ \\fbox") is None  # a response: cut after the command
