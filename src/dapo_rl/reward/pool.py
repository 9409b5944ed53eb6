"""Batch scoring in worker processes with a hard per-answer time limit.

A verifier that hangs (sympy on a tower of powers, a regex on a megabyte of brackets) must never stall training. Each
answer is sent to a worker process on its own; when a worker has not answered within `timeout_s`, the parent kills it
(SIGKILL), scores that answer as wrong with `timeout` set, and starts a fresh worker. Workers are forked from a clean
server process (`forkserver`) that has imported the verifiers once, so a replacement starts in milliseconds and never
inherits the trainer's threads. Model output is only ever passed as data: nothing is executed. Workers ignore SIGTERM:
`timeout` and Slurm signal every process of the job, and the trainer scores its last step before it stops
(`dapo_rl.trainer`); a worker ends when the pool closes its pipe or kills it.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from dapo_rl.reward.result import WRONG_SCORE, ScoreResult, timeout_result

PRELOAD = [
    "dapo_rl.reward.score",
    "dapo_rl.reward.pool",
    "dapo_rl.reward.math_verifier",
    "math_verify",
    "reasoning_gym",
]
"""Imported once by the fork server, so every worker (and every replacement of a killed one) starts warm."""

ScoreItem = tuple[str, str, Any, Mapping[str, Any] | None]
"""`(data_source, solution_str, ground_truth, extra_info)`: one response to score."""


def _worker(conn: Connection, verifier: str, timeout_s: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the pool ends it (see the module docstring)
    from dapo_rl.reward.score import compute_score

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        idx, (source, text, gt, extra), options = msg
        res = compute_score(source, text, gt, extra, verifier=verifier, timeout_s=timeout_s, **options)
        conn.send((idx, dict(res)))


class _Worker:
    def __init__(self, ctx, verifier: str, timeout_s: float):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, verifier, timeout_s), daemon=True)
        self.proc.start()
        child.close()
        self.job: int | None = None
        self.started = 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class RewardPool:
    """Scores batches of responses in `num_workers` processes, each answer bounded by `timeout_s`.

    Args:
        verifier: `auto` (by `data_source`), `math`, `math_dapo`, `reasoning_gym` or `module:function`.
        num_workers: worker processes; 0 scores in this process (the `math` verifier keeps to `timeout_s` on the
            main thread, see `compute_score_math`; other verifiers and other threads have no hard limit there).
        timeout_s: seconds one answer may take, including the verifier's own limits; past it the worker is killed.
        partial_credit: reasoning-gym's partial credit instead of DAPO's ±1 (`reward.partial_credit`).
        lenient: the `math` verifier's evaluation-harness leniency (`reward.lenient`).

    Use as a context manager or call `close()`; `stats` counts `scored`, `errors` and `timeouts` so far.
    """

    def __init__(
        self,
        verifier: str = "auto",
        num_workers: int = 1,
        timeout_s: float = 5.0,
        *,
        partial_credit: bool = False,
        lenient: bool = False,
    ):
        if num_workers < 0:
            raise ValueError(f"reward.num_workers={num_workers} must be >= 0")
        if timeout_s <= 0:
            raise ValueError(f"reward.timeout_s={timeout_s} must be > 0")
        from dapo_rl.reward.score import resolve_verifier

        resolve_verifier(verifier)  # fail early on a bad name or an unimportable user function
        self.verifier, self.num_workers, self.timeout_s = verifier, num_workers, timeout_s
        self.options = {"partial_credit": partial_credit, "lenient": lenient}
        self._ctx = None
        self._workers: list[_Worker] = []
        if num_workers > 0:
            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload(PRELOAD)
            self._workers = [_Worker(self._ctx, verifier, timeout_s) for _ in range(num_workers)]

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers."""
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.proc.join(timeout=1)
            if w.proc.is_alive():
                w.kill()
        self._workers = []

    def score(self, items: Sequence[ScoreItem], *, lenient: bool | None = None) -> list[ScoreResult]:
        """Score every item; results come back in order. Never raises on model output.

        Args:
            items: `(data_source, solution_str, ground_truth, extra_info)` tuples.
            lenient: this call's `lenient` instead of the pool's (maj@k pools answers by equivalence alone, so
                ``2^{10}`` and ``1024`` vote together whichever comes first).

        Returns:
            One `ScoreResult` per item; an answer not settled in time gets `timeout_result` (score -1, acc False,
            `error` and `timeout: True`); a verifier error gets `error`.
        """
        options = self.options if lenient is None else {**self.options, "lenient": lenient}
        if self.num_workers == 0:
            from dapo_rl.reward.score import compute_score

            return [
                compute_score(s, t, g, e, verifier=self.verifier, timeout_s=self.timeout_s, **options)
                for s, t, g, e in items
            ]
        results: list[ScoreResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        while pending or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.job is None and pending:
                    idx = pending.popleft()
                    w.job, w.started = idx, time.monotonic()
                    w.conn.send((idx, items[idx], options))
            busy = [w for w in self._workers if w.job is not None]
            now = time.monotonic()
            next_deadline = min(w.started + self.timeout_s for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - now))
            for w in busy:
                if w.conn in ready:
                    try:
                        idx, res = w.conn.recv()
                    except (EOFError, OSError):  # the worker died (out of memory, a crash in native code)
                        res, idx = (
                            {"score": WRONG_SCORE, "acc": False, "pred": "", "error": "worker died"},
                            w.job,
                        )
                        self._replace(w)
                    results[idx] = res
                    w.job = None
                elif time.monotonic() - w.started >= self.timeout_s:
                    results[w.job] = timeout_result(self.timeout_s)
                    self._replace(w)
        return results  # type: ignore[return-value]

    def _replace(self, w: _Worker) -> None:
        w.kill()
        i = self._workers.index(w)
        self._workers[i] = _Worker(self._ctx, self.verifier, self.timeout_s)


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """`reward/error_rate` (verifier errors, timeouts excluded) and `reward/timeout_rate` of a batch."""
    n = max(len(results), 1)
    timeouts = sum(1 for r in results if r.get("timeout"))
    errors = sum(1 for r in results if "error" in r and not r.get("timeout"))
    return {"reward/error_rate": errors / n, "reward/timeout_rate": timeouts / n}
