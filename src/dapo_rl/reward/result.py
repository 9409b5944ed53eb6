"""The record every verifier returns, and the one used when scoring itself fails.

The shape follows verl's reward-function convention: a plain ``dict`` with ``score``, ``acc`` and ``pred``,
so a function written for verl can stand where ours stands and the other way round.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real
from typing import TypedDict

WRONG_SCORE = -1.0
"""Score of a wrong, missing or unscorable answer on DAPO's ±1 reward scale."""

CORRECT_SCORE = 1.0
"""Score of a correct answer on DAPO's ±1 reward scale."""


class _RequiredScoreFields(TypedDict):
    score: float
    acc: bool
    pred: str


class ScoreResult(_RequiredScoreFields, total=False):
    """What a verifier returns for one response.

    Keys:
        score: reward on DAPO's ±1 scale (1.0 correct, -1.0 wrong; reasoning-gym partial credit, an option, lies
            between).
        acc: whether the answer counts as correct (the dynamic-sampling filter groups on this).
        pred: the answer the verifier extracted from the response (for logs and maj@k).
        error: present only when scoring raised or ran out of time; ``"<ExceptionType: message>"``.
        timeout: present (True) only when the answer was not settled within `reward.timeout_s`.
        refused: present (True) only when the answer was not in its task's answer grammar and was refused before
            reaching a scorer that evaluates text (`dapo_rl.reward.answer_grammar`); such a response is wrong.
        reason: with `refused`, why (one line).
    """

    error: str
    timeout: bool
    refused: bool
    reason: str


def error_result(exc: BaseException) -> ScoreResult:
    """Build the result for a response whose scoring raised.

    Args:
        exc: the exception caught inside a verifier.

    Returns:
        ``{"score": -1.0, "acc": False, "pred": "", "error": "<ExceptionType: message>"}``.
    """
    return {"score": WRONG_SCORE, "acc": False, "pred": "", "error": f"{type(exc).__name__}: {exc}"}


def timeout_result(timeout_s: float) -> ScoreResult:
    """The result of an answer that was not settled within `timeout_s` seconds (wrong, `timeout` flagged).

    Args:
        timeout_s: the budget that ran out (`reward.timeout_s`).

    Returns:
        ``{"score": -1.0, "acc": False, "pred": "", "error": "TimeoutError: not settled within <t> s",
        "timeout": True}``.
    """
    return {
        "score": WRONG_SCORE,
        "acc": False,
        "pred": "",
        "error": f"TimeoutError: not settled within {timeout_s:g} s",
        "timeout": True,
    }


def refused_result(pred: str, reason: str) -> ScoreResult:
    """The result of an answer refused by its task's answer grammar (`dapo_rl.reward.answer_grammar`): wrong, and
    flagged so that `reward/refused_rate` counts it.

    Args:
        pred: the extracted answer.
        reason: why it was refused (one line).

    Returns:
        ``{"score": -1.0, "acc": False, "pred": pred, "refused": True, "reason": reason}``.
    """
    return {"score": WRONG_SCORE, "acc": False, "pred": pred, "refused": True, "reason": reason}


def checked_result(res: Mapping) -> ScoreResult:
    """A verifier's result with its score as a finite float.

    Args:
        res: what the verifier returned (`score`, `acc`, `pred`, optional `error`).

    Returns:
        `res` as a dict, `score` cast to float.

    Raises:
        ValueError: the score is missing, not a number, NaN or infinite (the caller turns it into an error result,
            so it counts in `reward/error_rate` instead of poisoning a group's advantages).
    """
    score = res.get("score")
    if isinstance(score, str) or not isinstance(score, Real) or not math.isfinite(float(score)):
        raise ValueError(f"the verifier returned a score that is not a finite number: {score!r}")
    return {**res, "score": float(score)}  # type: ignore[typeddict-item]
