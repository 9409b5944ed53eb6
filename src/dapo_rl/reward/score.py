"""verl-style reward entry point and the verifier registry.

`get_verifier(name)` gives a callable `(solution_str, ground_truth, extra_info=None) -> {"score", "acc", "pred"}`:

| name | verifier |
|---|---|
| `math` | final answer from the last "Answer:" line or `\\boxed{}`, cleaned, symbolic equivalence via math-verify (an unevaluated expression against a rational gold is wrong unless `lenient`) |
| `math_dapo` | DAPO's published "Answer:" scorer, bit-compatible, quirks included (reproduces the paper's numbers) |
| `reasoning_gym` | the task's own `score_answer` (+1 when fully right, else -1; its partial credit with `partial_credit`); the task is `reasoning_gym/<task>` in the name or the row's data source |
| `code` | the response's last Python block run against the row's hidden tests in the sandbox (`dapo_rl.reward.code`; the reward pool scores these rows itself, with one sandbox for the run) |
| `module:function` | a user function with verl's signature `(data_source, solution_str, ground_truth, extra_info)`, imported only when the config names it |

`compute_score(data_source, ...)` picks by `verifier` (`reward.name` in the config) or, with `auto`, by the row's
`data_source`: `reasoning_gym/<task>` rows go to reasoning-gym, code rows (`is_code_source`: verl's `codecontests`,
`apps`, `codeforces`, `taco`, and `humaneval`, `livecodebench`, `code/<task>`, ...) to `code`, everything else to
`math`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import cache, partial
from typing import Any

from dapo_rl.reward.answer_grammar import EVALUATING_TASKS, effective_task
from dapo_rl.reward.code.suites import CODE_SOURCES, is_code_source  # noqa: F401 (routing's names, here too)
from dapo_rl.reward.math_dapo import compute_score_math_dapo
from dapo_rl.reward.reasoning_gym import compute_score_reasoning_gym
from dapo_rl.reward.result import ScoreResult, checked_result, error_result

REASONING_GYM_PREFIX = "reasoning_gym/"
"""``data_source`` prefix of reasoning-gym rows; the rest is the task: ``"reasoning_gym/chain_sum"``."""

VERIFIERS = ("auto", "math", "math_dapo", "reasoning_gym", "code")
"""Built-in verifier names (plus `reasoning_gym/<task>` and `module:function`)."""


Verifier = Callable[..., ScoreResult]


def routes_to_code(verifier: str, data_source: str) -> bool:
    """Whether an item goes to the code reward: `verifier` is `code`, or `auto` and the row is a code row."""
    return verifier == "code" or (verifier == "auto" and is_code_source(data_source))


def _code(solution_str: str, ground_truth: Any, extra_info=None, **_) -> ScoreResult:
    """One response through a sandbox of its own (starting one costs about a second: the reward pool keeps one for
    the run instead)."""
    from dapo_rl.reward.code import score_code

    (res,) = score_code([(solution_str, ground_truth)])
    return res


def _math(
    solution_str: str,
    ground_truth: Any,
    extra_info=None,
    *,
    timeout_s: float = 5.0,
    lenient: bool = False,
    **_,
) -> ScoreResult:
    from dapo_rl.reward.math_verifier import compute_score_math

    return compute_score_math(solution_str, ground_truth, timeout_s=timeout_s, lenient=lenient)


def _math_dapo(solution_str: str, ground_truth: Any, extra_info=None, **_) -> ScoreResult:
    return compute_score_math_dapo(solution_str, ground_truth)


def _reasoning_gym(
    solution_str: str,
    ground_truth: Any,
    extra_info=None,
    *,
    task: str | None = None,
    partial_credit: bool = False,
    **_,
) -> ScoreResult:
    if task is None:
        meta = (extra_info or {}).get("metadata") or {}
        task = meta.get("source_dataset") if isinstance(meta, Mapping) else None
        if not task:
            return error_result(ValueError("reasoning_gym verifier: no task (name it reasoning_gym/<task>)"))
    return compute_score_reasoning_gym(
        task, solution_str, ground_truth, extra_info, partial_credit=partial_credit
    )


@cache
def _user_function(spec: str) -> Callable[..., Any]:
    module, _, func = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward.name={spec!r}: cannot import {func!r} from module {module!r} ({e})") from e
    if not callable(fn):
        raise ValueError(f"reward.name={spec!r}: {func!r} is not callable")
    return fn


def resolve_verifier(name: str) -> Verifier | None:
    """The verifier callable for a name; None for `auto` (chosen per row by `data_source`).

    Raises:
        ValueError: unknown name, or a `module:function` that cannot be imported.
    """
    if name == "auto":
        return None
    if name == "math":
        return _math
    if name == "math_dapo":
        return _math_dapo
    if name == "reasoning_gym":
        return _reasoning_gym
    if name == "code":
        return _code
    if name.startswith(REASONING_GYM_PREFIX):
        return partial(_reasoning_gym, task=name[len(REASONING_GYM_PREFIX) :])
    if ":" in name:
        fn = _user_function(name)

        def user(solution_str, ground_truth, extra_info=None, *, data_source="", **_):
            out = fn(data_source, solution_str, ground_truth, extra_info)
            if isinstance(out, Mapping):
                res = dict(out)
                res.setdefault("acc", float(res.get("score", 0.0)) > 0)
                res.setdefault("pred", "")
                return res
            return {"score": float(out), "acc": float(out) > 0, "pred": ""}

        user.accepts_data_source = True  # type: ignore[attr-defined]
        return user
    raise ValueError(
        f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)}, reasoning_gym/<task>, or module:function"
    )


def get_verifier(name: str) -> Verifier:
    """A callable `(solution_str, ground_truth, extra_info=None) -> {"score", "acc", "pred"}` for a verifier name.

    Raises:
        ValueError: unknown name (or `auto`, which needs a data source: use `compute_score`).
    """
    fn = resolve_verifier(name)
    if fn is None:
        raise ValueError("verifier 'auto' picks per row by data_source: call compute_score(data_source, ...)")
    return fn


def evaluates_text(verifier: str, data_source: str, extra_info: Mapping[str, Any] | None = None) -> bool:
    """Whether scoring this item reaches a scorer that evaluates the answer's text (a reasoning-gym task of
    `dapo_rl.reward.answer_grammar.EVALUATING_TASKS`): the reward pool then scores it in a confined worker even with
    ``reward.num_workers: 0``.

    Args:
        verifier: the pool's verifier name (`reward.name`).
        data_source: the row's ``data_source``.
        extra_info: the row's ``extra_info`` (a ``composite`` or untagged reasoning-gym row names its task in
            ``metadata["source_dataset"]``).
    """
    name = str(verifier)
    source = str(data_source)
    if name.startswith(REASONING_GYM_PREFIX):
        task = name[len(REASONING_GYM_PREFIX) :]
    elif name == "auto" and source.startswith(REASONING_GYM_PREFIX):
        task = source[len(REASONING_GYM_PREFIX) :]
    elif name == "reasoning_gym":
        task = "composite"
    else:
        return False
    meta = (extra_info or {}).get("metadata") if isinstance(extra_info, Mapping) else None
    if isinstance(meta, str):  # a parquet row may hold it as JSON text: decide on the safe side
        return True
    return effective_task(task, meta if isinstance(meta, Mapping) else {}) in EVALUATING_TASKS


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    *,
    verifier: str = "auto",
    timeout_s: float = 5.0,
    partial_credit: bool = False,
    lenient: bool = False,
) -> ScoreResult:
    """Score one response against its row's ground truth.

    Args:
        data_source: the row's ``data_source`` (verl schema); selects the verifier when ``verifier`` is `auto`:
            ``reasoning_gym/<task>`` -> reasoning-gym's own scorer, a code row (`is_code_source`) -> `code`,
            anything else -> `math`.
        solution_str: the decoded response (prompt excluded).
        ground_truth: the row's ``reward_model.ground_truth`` (str, int or float).
        extra_info: the row's ``extra_info`` (reasoning-gym reads ``question`` and ``metadata`` from it).
        verifier: `auto` or a name for `get_verifier` (the config's ``reward.name``).
        timeout_s: time limit handed to the verifier's own symbolic checks (the process pool enforces it hard).
        partial_credit: reasoning-gym rows score ``2s - 1`` for reasoning-gym's score ``s`` in [0, 1] instead of
            DAPO's ±1 (`reward.partial_credit`; wrong answers can then score above -1). Other verifiers ignore it.
        lenient: the `math` verifier also reads a response without "Answer:" or a box by its last number, and
            accepts an unevaluated expression equal to a rational gold (`reward.lenient`; for scoring other
            models as evaluation harnesses do, not for training). Other verifiers ignore it.

    Returns:
        ``{"score": float, "acc": bool, "pred": str}`` on DAPO's ±1 scale (every built-in verifier gives +1 or
        -1 unless ``partial_credit``; a `module:function` verifier's score is passed on as it returns it),
        plus ``"error"`` only when scoring
        failed: the verifier raised, or returned a score that is not a finite number (NaN, inf, a string), which
        scores -1 like any error. Never raises on model output.

    Source: the signature of a verl custom reward function (``compute_score(data_source, solution_str,
    ground_truth, extra_info)``), so verl recipes can point at this function.
    """
    source = str(data_source)
    try:
        fn = resolve_verifier(verifier)
        if fn is None:
            if source.startswith(REASONING_GYM_PREFIX):
                fn = partial(_reasoning_gym, task=source[len(REASONING_GYM_PREFIX) :])
            elif is_code_source(source):
                fn = _code
            else:
                fn = _math
        options = {"timeout_s": timeout_s, "partial_credit": partial_credit, "lenient": lenient}
        if getattr(fn, "accepts_data_source", False):
            res = fn(solution_str, ground_truth, extra_info, data_source=source, **options)
        else:
            res = fn(solution_str, ground_truth, extra_info, **options)
        return checked_result(res)
    except Exception as e:  # a verifier must never take training down
        return error_result(e)
