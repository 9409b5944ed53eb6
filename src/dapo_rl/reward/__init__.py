"""Rewards: verifiers that turn a decoded response into ``{"score", "acc", "pred"}`` on DAPO's ±1 scale.

Nothing here imports torch. Entry point: :func:`compute_score` (verl's reward-function signature), which
dispatches on ``data_source`` (or the configured verifier name) to the `math` verifier (math-verify based), DAPO's
bit-compatible `math_dapo` scorer, or a reasoning-gym task's scorer; `get_verifier(name)` returns one by name.
"""

from dapo_rl.reward.extract import clean_answer, extract_final_answer, is_hedged
from dapo_rl.reward.math_dapo import (
    ANSWER_PATTERN,
    INVALID_PRED,
    RESPONSE_WINDOW_CHARS,
    compute_score_math_dapo,
    last_answer_line,
    normalize_final_answer,
)
from dapo_rl.reward.math_verifier import compute_score_math, gsm8k_ground_truth
from dapo_rl.reward.reasoning_gym import compute_score_reasoning_gym, score_answer_fn
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE, ScoreResult, error_result
from dapo_rl.reward.score import REASONING_GYM_PREFIX, VERIFIERS, compute_score, get_verifier
from dapo_rl.reward.shaping import repetition_fraction, repetition_penalty

__all__ = [
    "ANSWER_PATTERN",
    "CORRECT_SCORE",
    "INVALID_PRED",
    "REASONING_GYM_PREFIX",
    "RESPONSE_WINDOW_CHARS",
    "WRONG_SCORE",
    "ScoreResult",
    "VERIFIERS",
    "clean_answer",
    "compute_score",
    "compute_score_math",
    "compute_score_math_dapo",
    "compute_score_reasoning_gym",
    "error_result",
    "extract_final_answer",
    "get_verifier",
    "gsm8k_ground_truth",
    "is_hedged",
    "last_answer_line",
    "normalize_final_answer",
    "repetition_fraction",
    "repetition_penalty",
    "score_answer_fn",
]
