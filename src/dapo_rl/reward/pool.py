"""Batch scoring in confined worker processes with a hard per-answer time limit.

A verifier that hangs (sympy on a tower of powers, a regex on a megabyte of brackets) must never stall training.
Answers go to worker processes a few at a time, and each result comes back on its own; when a worker has not answered
within `timeout_s` (counted from its previous answer), the parent kills it (SIGKILL), scores that answer as wrong with
`timeout` set, starts a fresh worker and sends the answers the killed one had not reached again. Workers are forked from a clean
server process (`forkserver`) that has imported the verifiers once, so a replacement starts in milliseconds and never
inherits the trainer's threads.

Model output is only ever passed as data. No built-in verifier executes it: the reasoning-gym scorers that evaluate
text (sympy's ``parse_expr``, ``eval``) receive an answer only inside the task's answer grammar
(`dapo_rl.reward.answer_grammar`), and the `math` verifier's one ``parse_expr`` (Math-Verify's plain-expression
extraction) sees only digits, dots, spaces and ``+-*/^()``. Each worker also confines itself before it reads anything
(`dapo_rl.sandbox.confine`: memory, file-size, open-file and CPU limits, no writes outside its own temporary
directory, no network, no child processes, no exec), so a scorer that evaluated what it should not could still do
nothing outside that worker. With ``num_workers=0`` the items whose scorer evaluates text
(`dapo_rl.reward.score.evaluates_text`) are still scored in one such worker.

Workers ignore SIGTERM and SIGINT: `timeout`, Slurm and a terminal's Ctrl-C signal every process of the job, and the
trainer scores its last step before it stops (`dapo_rl.trainer`); a worker ends when the pool closes its pipe or kills it, and any worker still
alive when the interpreter exits is killed then (`dapo_rl.children`).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from dapo_rl import children
from dapo_rl.reward.result import WRONG_SCORE, ScoreResult, timeout_result

PRELOAD = [
    "dapo_rl.reward.score",
    "dapo_rl.reward.pool",
    "dapo_rl.sandbox",
    "landlockpy",
    "dapo_rl.reward.math_verifier",
    "math_verify",
    "reasoning_gym",
]
"""Imported once by the fork server, so every worker (and every replacement of a killed one) starts warm."""

ScoreItem = tuple[str, str, Any, Mapping[str, Any] | None]
"""`(data_source, solution_str, ground_truth, extra_info)`: one response to score."""


READY_TIMEOUT_S = 120.0
"""Seconds a new worker may take to confine itself and say so (the first one also waits for the fork server to
import `PRELOAD`)."""

_WARNED = False


MAX_CHUNK = 32
"""The most answers the pool sends a worker in one message (`RewardPool._chunk_size`)."""

MAX_RESULT_BYTES = 1 << 20
"""The largest result a worker may send back (JSON); a longer one is an error result."""


def _json_value(x: Any) -> Any:
    """A user verifier's extra field as JSON can carry it (a numpy scalar as its value, anything else as text)."""
    item = getattr(x, "item", None)
    return item() if callable(item) else str(x)


def _send_json(conn: Connection, obj: Any) -> None:
    conn.send_bytes(json.dumps(obj, default=_json_value).encode())


def _checked(raw: bytes) -> ScoreResult:
    """A worker's result read as data, never unpickled (code running in a worker, which the grammars and limits
    exist to prevent, could otherwise send an object whose unpickling runs code in the trainer: review of issue 42,
    M1): a JSON object with a finite number `score`; `acc`, `timeout`, `refused` read as booleans, `pred`, `error`,
    `reason` as text; other fields pass as the JSON values they are.

    Raises:
        ValueError: not a JSON object with a finite `score`.
    """
    res = json.loads(raw)
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


def _close_inherited_fds(keep: int) -> None:
    """Close every descriptor but stdio and `keep` (the pipe to the pool): what the fork server hands its children
    (its alive pipe, the resource tracker's pipe) would let code in the worker ask those unconfined helpers for a
    new process or for a file to be unlinked (review of issue 42, M2)."""
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._fd = None  # closed below; the worker never tracks a resource
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096)


def _worker(conn: Connection, verifier: str, timeout_s: float, workdir: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the pool ends it (see the module docstring)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C too: no traceback; the trainer decides
    from dapo_rl.reward.score import compute_score
    from dapo_rl.sandbox import confine, cpu_budget

    _close_inherited_fds(conn.fileno())
    _send_json(conn, confine(workdir).missing())
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        chunk, options = msg
        for source, text, gt, extra in chunk:  # each result is sent as soon as it is scored (the deadlines)
            cpu_budget(2 * timeout_s)  # a backstop: the parent kills it at timeout_s of wall time
            res = compute_score(source, text, gt, extra, verifier=verifier, timeout_s=timeout_s, **options)
            _send_json(conn, dict(res))


class _Worker:
    def __init__(self, ctx, verifier: str, timeout_s: float):
        self.workdir = tempfile.mkdtemp(prefix="dapo-score-")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(child, verifier, timeout_s, self.workdir), daemon=True)
        self.proc.start()
        children.register(self.proc)
        child.close()
        self.jobs: deque[int] = deque()  # the items sent and not answered yet, the one being scored first
        self.started = 0.0  # when the first of `jobs` began: its chunk was sent or the previous result came
        self.missing: list[str] | None = None

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for the worker to confine itself; warn once per process about layers the OS did not give.

        Raises:
            RuntimeError: it died or did not answer in time (it is killed).
        """
        global _WARNED
        try:
            if not self.conn.poll(timeout_s):
                raise RuntimeError(f"a reward worker did not start within {timeout_s:.0f} s")
            missing = json.loads(self.conn.recv_bytes(MAX_RESULT_BYTES))
            if not isinstance(missing, list) or not all(isinstance(x, str) for x in missing):
                raise ValueError("not a list of lines")
            self.missing = missing
        except (EOFError, OSError, ValueError) as e:
            self.kill()
            raise RuntimeError(f"a reward worker died while starting (exit code {self.proc.exitcode})") from e
        except RuntimeError:
            self.kill()
            raise
        if self.missing and not _WARNED:
            _WARNED = True
            warnings.warn(
                "reward workers run with fewer OS limits than they could: " + "; ".join(self.missing),
                RuntimeWarning,
                stacklevel=3,
            )

    def kill(self) -> None:
        children.kill(self.proc)
        self.conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


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

    Use as a context manager or call `close()`.

    Raises:
        RuntimeError: a worker died or did not start within `READY_TIMEOUT_S` (all are stopped).
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
        if not 0 < timeout_s < float("inf"):  # NaN fails both: it would time every answer out
            raise ValueError(f"reward.timeout_s={timeout_s} must be a finite number > 0")
        from dapo_rl.reward.score import resolve_verifier

        resolve_verifier(verifier)  # fail early on a bad name or an unimportable user function
        self.verifier, self.num_workers, self.timeout_s = verifier, num_workers, timeout_s
        self.options = {"partial_credit": partial_credit, "lenient": lenient}
        self._ctx = None
        self._workers: list[_Worker] = []
        self._confined: RewardPool | None = None  # num_workers=0: the worker for items that evaluate text
        if num_workers > 0:
            self._ctx = mp.get_context("forkserver")
            self._ctx.set_forkserver_preload(PRELOAD)
            try:
                self._workers = [_Worker(self._ctx, verifier, timeout_s) for _ in range(num_workers)]
                for w in self._workers:  # started side by side above, confined each on its own
                    w.ready()
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (each gets a second to finish, then is killed); idempotent."""
        workers, self._workers = self._workers, []
        try:
            for w in workers:
                try:
                    w.conn.send(None)
                except OSError:
                    pass
            for w in workers:
                w.proc.join(timeout=1)
        finally:  # a second Ctrl-C in a join still ends every worker and removes its directory
            for w in workers:
                w.kill()
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
            `error` and `timeout: True`); a verifier error gets `error`.
        """
        options = self.options if lenient is None else {**self.options, "lenient": lenient}
        if self.num_workers == 0:
            return self._score_here(items, options)
        results: list[ScoreResult | None] = [None] * len(items)
        pending = deque(range(len(items)))
        while pending or any(w.jobs for w in self._workers):
            for w in self._workers:
                if not w.jobs and pending:
                    chunk = [pending.popleft() for _ in range(self._chunk_size(len(pending)))]
                    w.jobs.extend(chunk)
                    w.started = time.monotonic()
                    try:  # the worker trusts the pool, not the other way round
                        w.conn.send(([items[i] for i in chunk], options))
                    except (
                        OSError
                    ):  # it died while idle (out of memory): a fresh one takes the chunk next round
                        self._replace(w, pending)
            busy = [w for w in self._workers if w.jobs]
            if not busy:
                continue
            next_deadline = min(w.started + self.timeout_s for w in busy)
            ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            for w in busy:
                if w.conn in ready:
                    idx = w.jobs.popleft()
                    w.started = time.monotonic()
                    try:
                        res = _checked(w.conn.recv_bytes(MAX_RESULT_BYTES))
                    except (EOFError, OSError) as e:  # it died (out of memory, native code), or sent too much
                        # (multiprocessing's "bad message length": the pipe is out of step after it)
                        too_long = "message length" in str(e)
                        why = f"result longer than {MAX_RESULT_BYTES} bytes" if too_long else "worker died"
                        res = {"score": WRONG_SCORE, "acc": False, "pred": "", "error": why}
                        self._replace(w, pending)
                    except ValueError as e:  # not a score record (JSON)
                        res = {"score": WRONG_SCORE, "acc": False, "pred": "", "error": f"ValueError: {e}"}
                        self._replace(w, pending)
                    results[idx] = res
                elif time.monotonic() - w.started >= self.timeout_s:
                    results[w.jobs.popleft()] = timeout_result(self.timeout_s)
                    self._replace(w, pending)
        return results  # type: ignore[return-value]

    def _score_here(self, items: Sequence[ScoreItem], options: dict) -> list[ScoreResult]:
        """``num_workers=0``: score in this process, except the items whose scorer evaluates text."""
        from dapo_rl.reward.score import compute_score, evaluates_text

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

    def _chunk_size(self, pending: int) -> int:
        """Answers sent to a worker in one message: up to `MAX_CHUNK`, a quarter of each worker's share of what is
        left, so that the workers finish together while the microsecond verifiers do not pay a pipe round trip
        per answer. Each answer keeps its own deadline (its chunk's send or the previous answer's result)."""
        return min(pending, max(1, min(MAX_CHUNK, pending // (4 * len(self._workers)))))

    def _replace(self, w: _Worker, pending: deque[int]) -> None:
        """Kill `w` and start a fresh worker in its place; the answers it was sent and never scored go back to the
        front of `pending`."""
        pending.extendleft(reversed(w.jobs))
        w.jobs.clear()
        w.kill()
        i = self._workers.index(w)
        self._workers[i] = _Worker(self._ctx, self.verifier, self.timeout_s)
        self._workers[i].ready()


def summarize(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """`reward/error_rate` (verifier errors, timeouts excluded), `reward/timeout_rate` and `reward/refused_rate`
    (answers outside their task's grammar) of a batch."""
    n = max(len(results), 1)
    refused = sum(1 for r in results if r.get("refused"))
    timeouts = sum(1 for r in results if r.get("timeout"))
    errors = sum(1 for r in results if "error" in r and not r.get("timeout"))
    return {
        "reward/error_rate": errors / n,
        "reward/timeout_rate": timeouts / n,
        "reward/refused_rate": refused / n,
    }
