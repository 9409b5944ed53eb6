"""verl-style reward entry point: pick the verifier for a row's ``data_source`` and score one response."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dapo_rl.reward.math_dapo import compute_score_math_dapo
from dapo_rl.reward.reasoning_gym import compute_score_reasoning_gym
from dapo_rl.reward.result import ScoreResult

REASONING_GYM_PREFIX = "reasoning_gym/"
"""``data_source`` prefix of reasoning-gym rows; the rest is the task: ``"reasoning_gym/chain_sum"``."""


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
) -> ScoreResult:
    """Score one response against its row's ground truth, with the verifier its ``data_source`` asks for.

    Dispatch:
        * ``"reasoning_gym/<task>"`` -> :func:`compute_score_reasoning_gym` with ``task``.
        * everything else -> DAPO's "Answer:" verifier :func:`compute_score_math_dapo`. That covers the math
          sources (``"math_dapo"``, ``"DAPO-17k"``, ``"aime..."``, ``"math..."``) and, by design, any unknown
          ``data_source``: DAPO's prompt template asks every math problem for an "Answer:" line.

    Args:
        data_source: the row's ``data_source`` (verl schema); a non-``str`` value is converted with ``str()``.
        solution_str: the decoded response (prompt excluded).
        ground_truth: the row's ``reward_model.ground_truth``.
        extra_info: the row's ``extra_info`` (reasoning-gym reads ``question`` and ``metadata`` from it).

    Returns:
        ``{"score": float, "acc": bool, "pred": str}`` on DAPO's ±1 scale, plus ``"error"`` only when scoring
        failed. Never raises on model output.

    Source: the signature of a verl custom reward function (``compute_score(data_source, solution_str,
    ground_truth, extra_info)``), so verl recipes can point at this function.
    """
    source = str(data_source)
    if source.startswith(REASONING_GYM_PREFIX):
        task = source[len(REASONING_GYM_PREFIX) :]
        return compute_score_reasoning_gym(task, solution_str, ground_truth, extra_info)
    return compute_score_math_dapo(solution_str, ground_truth)
