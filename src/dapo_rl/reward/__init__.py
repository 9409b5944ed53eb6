"""Rewards: verifiers that turn a decoded response into ``{"score", "acc", "pred"}`` on DAPO's ±1 scale.

Nothing here imports torch. Entry point: :func:`compute_score` (verl's reward-function signature), which
dispatches on ``data_source`` to DAPO's "Answer:" math verifier or to a reasoning-gym task's scorer.
"""

from dapo_rl.reward.math_dapo import (
    ANSWER_PATTERN,
    INVALID_PRED,
    RESPONSE_WINDOW_CHARS,
    compute_score_math_dapo,
    last_answer_line,
    normalize_final_answer,
)
from dapo_rl.reward.reasoning_gym import compute_score_reasoning_gym, score_answer_fn
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE, ScoreResult, error_result
from dapo_rl.reward.score import REASONING_GYM_PREFIX, compute_score

__all__ = [
    "ANSWER_PATTERN",
    "CORRECT_SCORE",
    "INVALID_PRED",
    "REASONING_GYM_PREFIX",
    "RESPONSE_WINDOW_CHARS",
    "WRONG_SCORE",
    "ScoreResult",
    "compute_score",
    "compute_score_math_dapo",
    "compute_score_reasoning_gym",
    "error_result",
    "last_answer_line",
    "normalize_final_answer",
    "score_answer_fn",
]
