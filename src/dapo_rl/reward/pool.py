"""Batch scoring in confined worker processes with a hard per-answer time limit.

A verifier that hangs (sympy on a tower of powers, a regex on a megabyte of brackets) must never stall training.
The answers go to the sandbox's worker processes (`dapo_rl.sandbox.workers.WorkerPool`: forked from a clean server
process that has imported the verifiers once, sent a few answers at a time, each killed with SIGKILL and replaced
when an answer is not settled within `timeout_s` of its previous one, the answers it had not reached sent again);
this module decides what they run (`compute_score` with the pool's verifier) and what a worker that ran out of time
(`timeout_result`: wrong, `timeout` set), died or sent something other than a score record (wrong, with `error`)
scores.

Model output is only ever passed as data. No built-in verifier executes it: the reasoning-gym scorers that evaluate
text (sympy's ``parse_expr``, ``eval``) receive an answer only inside the task's answer grammar
(`dapo_rl.reward.answer_grammar`), and the `math` verifier's one ``parse_expr`` (Math-Verify's plain-expression
extraction) sees only digits, dots, spaces and ``+-*/^()``. Each worker is also confined before it reads anything
(`dapo_rl.sandbox.confinement`: memory, file-size, open-file and CPU limits, no writes outside its own temporary
directory, no network, no child processes, no exec), so a scorer that evaluated what it should not could still do
nothing outside that worker, and what a worker sends back is read as JSON data (`_checked`), never unpickled. With
``num_workers=0`` the items whose scorer evaluates text (`dapo_rl.reward.score.evaluates_text`) are still scored in
one such worker.

Workers ignore SIGTERM and SIGINT: `timeout`, Slurm and a terminal's Ctrl-C signal every process of the job, and the
trainer scores its last step before it stops (`dapo_rl.trainer`); a worker ends when the pool closes or kills it,
and any worker still alive when the interpreter exits is killed then (`dapo_rl.children`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from dapo_rl.reward.result import WRONG_SCORE, ScoreResult, timeout_result
from dapo_rl.reward.score import compute_score, evaluates_text, resolve_verifier, routes_to_code
from dapo_rl.sandbox.workers import WorkerPool

PRELOAD = [
    "dapo_rl.reward.score",
    "dapo_rl.reward.pool",
    "dapo_rl.reward.math_verifier",
    "math_verify",
    "reasoning_gym",
]
"""Imported once by the fork server (after the sandbox's own modules), so every worker (and every replacement of a
killed one) starts warm."""

ScoreItem = tuple[str, str, Any, Mapping[str, Any] | None]
"""`(data_source, solution_str, ground_truth, extra_info)`: one response to score."""


def _score_item(item: ScoreItem, options: Mapping[str, Any], *, verifier: str, timeout_s: float) -> dict:
    """The workers' target: score one item with `verifier` (`compute_score`, keyword `options`); never raises on
    model output."""
    source, text, gt, extra = item
    return dict(compute_score(source, text, gt, extra, verifier=verifier, timeout_s=timeout_s, **options))


def _checked(res: Any) -> ScoreResult:
    """A worker's result, already parsed from JSON by the sandbox (never unpickled: code running in a worker, which
    the grammars and limits exist to prevent, could otherwise send an object whose unpickling runs code in the
    trainer: review of issue 42, M1), checked as a score record: a JSON object with a finite number `score`; `acc`,
    `timeout`, `refused` read as booleans, `pred`, `error`, `reason` as text; other fields pass as the JSON values
    they are.

    Raises:
        ValueError: not a JSON object with a finite `score` (the sandbox then replaces that worker).
    """
    score = res.get("score") if isinstance(res, dict) else None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise ValueError("a reward worker sent something that is not a score record")
    res["score"] = float(score)
    for key in ("acc", "timeout", "refused"):
        if key in res:
            res[key] = bool(res[key])
    for key in ("pred", "error", "reason"):
        if key in res:
            res[key] = str(res[key])
    return res  # type: ignore[return-value]


def _failed(why: str) -> ScoreResult:
    """The result of an answer whose worker died, sent too much, or sent something other than a score record."""
    return {"score": WRONG_SCORE, "acc": False, "pred": "", "error": why}


class RewardPool:
    """Scores batches of responses in `num_workers` processes, each answer bounded by `timeout_s`.

    Args:
        verifier: `auto` (by `data_source`), `math`, `math_dapo`, `reasoning_gym` or `module:function`.
        num_workers: worker processes; 0 scores in this process (the `math` verifier keeps to `timeout_s` on the
            main thread, see `compute_score_math`; other verifiers and other threads have no hard limit there),
            except the items whose scorer evaluates text, which go to one confined worker started on first need.
        timeout_s: seconds one answer may take, including the verifier's own limits; past it the worker is killed.
        partial_credit: reasoning-gym's partial credit instead of DAPO's ±1 (`reward.partial_credit`).
        lenient: the `math` verifier's evaluation-harness leniency (`reward.lenient`).
        code: the code reward's limits (`dapo_rl.reward.code.CodeLimits`, from `reward.code`); None: its defaults.
        code_pass_rate: the code reward scores the share of tests passed (`reward.code.pass_rate`).

    Items that go to the code reward (`reward.name: code`, or `auto` on a code row) are scored in this process by a
    `dapo_rl.reward.code.CodeScorer` started on first need: its programs run in the program sandbox (`num_workers`
    of them side by side, at least one) and its verdicts are taken here, from their data.

    Use as a context manager or call `close()`.

    Raises:
        ValueError: `num_workers` < 0, `timeout_s` not a finite number > 0, or an unknown or unimportable
            verifier.
        RuntimeError: a worker died or did not start within `dapo_rl.sandbox.workers.READY_TIMEOUT_S` (all are
            stopped).
    """

    def __init__(
        self,
        verifier: str = "auto",
        num_workers: int = 1,
        timeout_s: float = 5.0,
        *,
        partial_credit: bool = False,
        lenient: bool = False,
        code=None,
        code_pass_rate: bool = False,
    ):
        if num_workers < 0:
            raise ValueError(f"reward.num_workers={num_workers} must be >= 0")
        if not 0 < timeout_s < float("inf"):  # NaN fails both: it would time every answer out
            raise ValueError(f"reward.timeout_s={timeout_s} must be a finite number > 0")
        resolve_verifier(verifier)  # fail early on a bad name or an unimportable user function
        self.verifier, self.num_workers, self.timeout_s = verifier, num_workers, timeout_s
        self.options = {"partial_credit": partial_credit, "lenient": lenient}
        self._sandbox: WorkerPool[ScoreResult] | None = None
        self._confined: RewardPool | None = None  # num_workers=0: the worker for items that evaluate text
        self._code_limits, self._code_pass_rate = code, code_pass_rate
        self._code = None  # the code reward's CodeScorer, started on first need
        if num_workers > 0 and verifier != "code":
            self._sandbox = WorkerPool(
                functools.partial(_score_item, verifier=verifier, timeout_s=timeout_s),
                num_workers,
                timeout_s,
                check=_checked,
                on_timeout=timeout_result,
                on_error=_failed,
                preload=PRELOAD,
                name="reward",
            )

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (each gets a second to finish, then is killed); idempotent."""
        try:
            if self._sandbox is not None:
                self._sandbox.close()
            if self._code is not None:
                self._code.close()
                self._code = None
        finally:
            if self._confined is not None:
                self._confined.close()
                self._confined = None

    def score(self, items: Sequence[ScoreItem], *, lenient: bool | None = None) -> list[ScoreResult]:
        """Score every item; results come back in order. Never raises on model output.

        Args:
            items: `(data_source, solution_str, ground_truth, extra_info)` tuples.
            lenient: this call's `lenient` instead of the pool's (maj@k pools answers by equivalence alone, so
                ``2^{10}`` and ``1024`` vote together whichever comes first).

        Returns:
            One `ScoreResult` per item; an answer not settled in time gets `timeout_result` (score -1, acc False,
            `error` and `timeout: True`); a verifier error gets `error`, and so does an answer whose worker died
            (``"worker died"``) or sent more than `dapo_rl.sandbox.workers.MAX_RESULT_BYTES` (``"result longer than
            <n> bytes"``).

        Raises:
            RuntimeError: a replacement worker did not start.
        """
        options = self.options if lenient is None else {**self.options, "lenient": lenient}
        code = [i for i, item in enumerate(items) if routes_to_code(self.verifier, item[0])]
        if not code:
            return self._score_rest(items, options)
        results: list[ScoreResult | None] = [None] * len(items)
        for i, res in zip(code, self._code_scorer().score([(items[i][1], items[i][2]) for i in code])):
            results[i] = res
        rest = [i for i in range(len(items)) if results[i] is None]
        for i, res in zip(rest, self._score_rest([items[i] for i in rest], options) if rest else []):
            results[i] = res
        return results  # type: ignore[return-value]

    def _code_scorer(self):
        if self._code is None:
            from dapo_rl.reward.code import CodeLimits, CodeScorer

            limits = self._code_limits if self._code_limits is not None else CodeLimits()
            self._code = CodeScorer(max(1, self.num_workers), limits, pass_rate=self._code_pass_rate)
        return self._code

    def _score_rest(self, items: Sequence[ScoreItem], options: dict) -> list[ScoreResult]:
        if self._sandbox is None:
            return self._score_here(items, options)
        return self._sandbox.run(items, options)

    def _score_here(self, items: Sequence[ScoreItem], options: dict) -> list[ScoreResult]:
        """``num_workers=0``: score in this process, except the items whose scorer evaluates text."""
        results: list[ScoreResult | None] = [None] * len(items)
        confined = [i for i, (s, _, _, e) in enumerate(items) if evaluates_text(self.verifier, s, e)]
        if confined:
            if self._confined is None:
                self._confined = RewardPool(self.verifier, 1, self.timeout_s, **self.options)
            for i, res in zip(
                confined, self._confined.score([items[i] for i in confined], lenient=options["lenient"])
            ):
                results[i] = res
        for i, (s, t, g, e) in enumerate(items):
            if results[i] is None:
                results[i] = compute_score(
                    s, t, g, e, verifier=self.verifier, timeout_s=self.timeout_s, **options
                )
        return results  # type: ignore[return-value]


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """`reward/error_rate` (verifier errors, timeouts excluded), `reward/timeout_rate` and `reward/refused_rate`
    (answers outside their task's grammar) of a batch, and the code reward's `reward/code_*` rates when it scored
    any (`dapo_rl.reward.code.code_summary`)."""
    from dapo_rl.reward.code import code_summary

    n = max(len(results), 1)
    refused = sum(1 for r in results if r.get("refused"))
    timeouts = sum(1 for r in results if r.get("timeout"))
    errors = sum(1 for r in results if "error" in r and not r.get("timeout"))
    return {
        "reward/error_rate": errors / n,
        "reward/timeout_rate": timeouts / n,
        "reward/refused_rate": refused / n,
        **code_summary(results),
    }
