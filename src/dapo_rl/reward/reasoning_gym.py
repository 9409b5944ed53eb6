"""Verifier for reasoning-gym tasks: the final answer scored by reasoning-gym's own ``score_answer``.

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates procedural reasoning tasks
(``chain_sum``, ``basic_arithmetic``, ...) and ships a scorer per task that returns a value in [0, 1], some
with partial credit. Here the response's final answer is read as the `math` verifier reads it (the last "Answer:" line or
``\\boxed{}``) and that
score is mapped onto DAPO's ±1 reward scale, so reasoning-gym tasks and math data share one convention.

``reasoning_gym`` is imported on first use, so math-only scoring does not pay for its import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from dapo_rl.reward.extract import extract_final_answer
from dapo_rl.reward.result import WRONG_SCORE, ScoreResult, error_result

ACC_TOLERANCE = 1e-9
"""A reasoning-gym score ``s`` counts as correct (``acc``) when ``s >= 1 - ACC_TOLERANCE``."""


@cache
def score_answer_fn(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    """Return reasoning-gym's ``score_answer(answer, entry) -> float`` for a task, cached per task name.

    Args:
        task: a registered reasoning-gym dataset name, e.g. ``"chain_sum"``.

    Returns:
        The bound ``score_answer`` of a default-configured dataset of that task (building one per call would
        repeat the dataset's set-up work; the cache holds one per task name, at most ~100 names exist).

    Raises:
        ValueError: if reasoning-gym has no task of that name (failures are not cached).
    """
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def _mapping_field(extra_info: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Read a dict field of ``extra_info``: missing or ``None`` gives ``{}``, a JSON string is decoded."""
    value = extra_info.get(key)
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"extra_info[{key!r}] must be a dict or a JSON object string, got {type(value).__name__}"
        )
    return dict(value)


def compute_score_reasoning_gym(
    task: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
) -> ScoreResult:
    """Score one response to a reasoning-gym task on DAPO's ±1 scale.

    The answer is taken by the same final-answer extraction as the `math` verifier
    (`dapo_rl.reward.extract.extract_final_answer`: the last "Answer:" line or the last ``\\boxed{}``, whichever
    comes later, searched in the whole response), with surrounding markdown, backticks, dollars and a trailing
    period removed, but no further normalisation (reasoning-gym answers can be lists or grids). It is scored with
    ``reasoning_gym.get_score_answer_fn(task)(answer, entry)`` where ``entry = {"question":
    extra_info["question"], "answer": ground_truth, "metadata": extra_info["metadata"]}``.

    Args:
        task: reasoning-gym dataset name, e.g. ``"chain_sum"`` (``compute_score`` takes it from a
            ``data_source`` of the form ``"reasoning_gym/<task>"``).
        solution_str: the decoded response (prompt excluded).
        ground_truth: the entry's ``"answer"`` as reasoning-gym generated it (usually a ``str``), passed on
            unchanged.
        extra_info: optional; ``"question"`` (str, default ``""``) and ``"metadata"`` (dict, default ``{}``)
            of the generated entry. ``metadata`` may have gone through JSON (lists where reasoning-gym had
            tuples) or be a JSON object string, as a parquet file may store it.

    Returns:
        ``{"score": 2*s - 1, "acc": s >= 1 - 1e-9, "pred": answer}`` with ``s`` the reasoning-gym score
        clipped to [0, 1]. Without a final answer: ``{"score": -1.0, "acc": False, "pred": ""}`` (the
        scorer is not called). Never raises: any failure (unknown task, malformed metadata, a scorer that
        raises or returns a non-finite value) returns ``score=-1.0``, ``acc=False``, ``pred=""`` and an
        ``error`` key ``"<ExceptionType: message>"``.

    Source: reasoning-gym ``ProceduralDataset.score_answer``; the linear map [0, 1] -> [-1, 1] puts 0 and 1
    at DAPO's wrong/correct rewards (arXiv 2503.14476 §2.4).
    """
    try:
        score_fn = score_answer_fn(task)
        answer = extract_final_answer(solution_str)
        if answer is None:
            return {"score": WRONG_SCORE, "acc": False, "pred": ""}
        pred = answer.strip().strip("*`$ ").rstrip(".").strip()
        info: Mapping[str, Any] = extra_info if extra_info is not None else {}
        question = info.get("question")
        entry = {
            "question": "" if question is None else str(question),
            "answer": ground_truth,
            "metadata": _mapping_field(info, "metadata"),
        }
        raw = float(score_fn(pred, entry))
        if not math.isfinite(raw):
            raise ValueError(f"reasoning-gym task {task!r} returned a non-finite score {raw}")
        s = min(max(raw, 0.0), 1.0)
    except Exception as exc:  # a verifier must never raise on model output
        return error_result(exc)
    return {"score": 2.0 * s - 1.0, "acc": s >= 1.0 - ACC_TOLERANCE, "pred": pred}
