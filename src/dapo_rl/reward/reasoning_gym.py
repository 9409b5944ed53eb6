"""Verifier for reasoning-gym tasks: the final answer scored by reasoning-gym's own ``score_answer``.

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates procedural reasoning tasks
(``chain_sum``, ``basic_arithmetic``, ...) and ships a scorer per task that returns a value in [0, 1], some
with partial credit. Here the response's final answer is read as the `math` verifier reads it (the last "Answer:" line or
``\\boxed{}``) and scored on DAPO's reward: +1 when reasoning-gym calls it fully right, -1 otherwise
(arXiv 2503.14476 §2.4). Partial credit (``partial_credit=True``, `reward.partial_credit`) maps the score ``s`` to
``2s - 1`` instead; it is off by default because it rewards wrong answers: ``chain_sum`` gives ``len(gold) /
len(answer)`` to any answer that contains the gold as a substring, so ``-16`` and ``116`` score +0.33 for a gold 16
and get a positive advantage over other wrong answers in a group.

An answer that is digits split by commas that are not thousands separators (``1,6``, ``12,34``) is wrong when the
gold has no comma: reasoning-gym strips every comma before comparing numbers, so ``1,6`` would count as 16.

Five tasks' scorers run sympy's ``parse_expr`` on the answer and four run ``eval`` on it; their answers must first pass
the task's grammar (`dapo_rl.reward.answer_grammar`), and the reward pool scores them in a confined worker.

``reasoning_gym`` is imported on first use, so math-only scoring does not pay for its import.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from dapo_rl.reward.answer_grammar import refusal
from dapo_rl.reward.extract import _THOUSANDS, extract_final_answer
from dapo_rl.reward.result import CORRECT_SCORE, WRONG_SCORE, ScoreResult, error_result, refused_result

ACC_TOLERANCE = 1e-9
"""A reasoning-gym score ``s`` counts as correct (``acc``) when ``s >= 1 - ACC_TOLERANCE``."""

_COMMA_DIGITS = re.compile(r"[+-]?\d+(?:,\d+)+(?:\.\d+)?")


def misplaced_commas(answer: str, ground_truth: Any) -> bool:
    """Whether ``answer`` is digits split by commas that are not thousands separators, against a comma-free gold.

    Args:
        answer: the extracted answer, stripped (``"1,6"``).
        ground_truth: the row's gold; a gold with a comma (a list answer such as ``"1,6"``) turns the check off.

    Returns:
        True for ``"1,6"``, ``"12,34"``, ``"1,6000"``, ``"0,500"`` against a comma-free gold; False for
        ``"1,600"``, ``"-12,345.5"`` (thousands separators), ``"16"`` and anything that is not comma-split digits.
    """
    if "," in str(ground_truth):
        return False
    compact = answer.replace(" ", "")
    return bool(_COMMA_DIGITS.fullmatch(compact)) and not _THOUSANDS.fullmatch(compact)


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
    *,
    partial_credit: bool = False,
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
        partial_credit: score ``2*s - 1`` instead of ±1 (see the module docstring for what it rewards).

    Returns:
        ``{"score": +1.0 if acc else -1.0, "acc": s >= 1 - 1e-9, "pred": answer}`` with ``s`` the
        reasoning-gym score clipped to [0, 1] (``"score": 2*s - 1`` with ``partial_credit``). An answer of
        comma-split digits against a comma-free gold (:func:`misplaced_commas`) scores -1 without calling the
        scorer. For the tasks whose scorer evaluates text (`dapo_rl.reward.answer_grammar.EVALUATING_TASKS`), an
        answer outside the task's answer grammar is refused without calling the scorer:
        `dapo_rl.reward.result.refused_result` (score -1, ``refused: True``, ``reason``). Without a final answer: ``{"score": -1.0, "acc": False, "pred": ""}`` (the
        scorer is not called). Never raises: any failure (unknown task, malformed metadata, a scorer that
        raises or returns a non-finite value) returns ``score=-1.0``, ``acc=False``, ``pred=""`` and an
        ``error`` key ``"<ExceptionType: message>"``.

    Source: reasoning-gym ``ProceduralDataset.score_answer``; DAPO's binary reward R = 1 if the answer is
    equivalent else -1 (arXiv 2503.14476 §2.4, Eq. 9); the partial-credit map [0, 1] -> [-1, 1] puts 0 and 1 at
    DAPO's wrong/correct rewards.
    """
    try:
        score_fn = score_answer_fn(task)
        answer = extract_final_answer(solution_str)
        if answer is None:
            return {"score": WRONG_SCORE, "acc": False, "pred": ""}
        pred = answer.strip().strip("*`$ ").rstrip(".").strip()
        if misplaced_commas(pred, ground_truth):
            return {"score": WRONG_SCORE, "acc": False, "pred": pred}
        info: Mapping[str, Any] = extra_info if extra_info is not None else {}
        question = info.get("question")
        entry = {
            "question": "" if question is None else str(question),
            "answer": ground_truth,
            "metadata": _mapping_field(info, "metadata"),
        }
        why = refusal(task, pred, ground_truth, entry["metadata"])
        if why is not None:  # the scorer would evaluate text outside the task's answer form
            return refused_result(pred, why)
        raw = float(score_fn(pred, entry))
        if not math.isfinite(raw):
            raise ValueError(f"reasoning-gym task {task!r} returned a non-finite score {raw}")
        s = min(max(raw, 0.0), 1.0)
    except Exception as exc:  # a verifier must never raise on model output
        return error_result(exc)
    acc = s >= 1.0 - ACC_TOLERANCE
    if partial_credit:
        return {"score": 2.0 * s - 1.0, "acc": acc, "pred": pred}
    return {"score": CORRECT_SCORE if acc else WRONG_SCORE, "acc": acc, "pred": pred}
