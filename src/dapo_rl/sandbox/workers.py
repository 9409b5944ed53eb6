"""A pool of confined worker processes that run a caller's function on untrusted items, each item under a hard deadline.

What any caller gets (`WorkerPool`):

- **isolation**: each worker is a fresh process forked from a clean server process (``forkserver``), so it never
  inherits the caller's threads or state; it closes every descriptor it inherited but its pipe to the pool, then
  confines itself (`dapo_rl.sandbox.confinement.confine`: no writes outside its own temporary directory, no network,
  no child processes, no exec) before it reads any item. The directory is removed when the worker ends.
- **limits**: the OS limits of `Limits` (address space, file size, open files), and a CPU budget of
  ``2 * timeout_s`` per item (`cpu_budget`) as a backstop to the wall-clock deadline.
- **timeouts**: items go to the workers a few at a time (up to `MAX_CHUNK`) and each result comes back on its own;
  an item has `timeout_s` seconds of wall time from its chunk's send or its previous result. Past it the pool kills
  the worker (SIGKILL), makes the item's result with the caller's `on_timeout`, starts a fresh worker and sends it
  the items the killed one had not reached. A worker that dies (out of memory, a crash in native code) costs its
  item the same way, through `on_error`. Results come back in the items' order.
- **results as data**: a worker sends each result as JSON (at most `MAX_RESULT_BYTES`); the pool parses it, never
  unpickles it, and hands it to the caller's `check`, which turns it into the caller's result or refuses it. Code
  running in a worker (what the confinement exists to contain) can therefore send back only data.

Workers ignore SIGTERM and SIGINT (``timeout``, Slurm and a terminal's Ctrl-C signal every process of the job, and
the caller decides when to stop): a worker ends when the pool closes its pipe or kills it, and any worker still alive
when the interpreter exits is killed then (`dapo_rl.children`).

This module knows nothing of rewards or of what the items are: the caller hands in an importable top-level function
(the reward pool's scorer, `dapo_rl.reward.pool`; later the Python tool and the code-execution verifier), and decides
what a timeout, a dead worker or a refused result becomes.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, Generic, TypeVar

from dapo_rl import children
from dapo_rl.sandbox.confinement import Limits

R = TypeVar("R")

Target = Callable[[Any, Any], Any]
"""`target(item, options) -> result`: run in a worker on one item; the result must be JSON-able (a numpy scalar is
sent as its value, any other object JSON cannot carry as its text). Must be picklable by reference: an importable
top-level function, or a `functools.partial` of one."""

SANDBOX_PRELOAD = ["dapo_rl.sandbox.workers", "dapo_rl.sandbox.confinement", "landlockpy"]
"""Imported once by the fork server for every pool; a pool's own `preload` comes after these."""

READY_TIMEOUT_S = 120.0
"""Seconds a new worker may take to confine itself and say so (the first one also waits for the fork server to
import the preloaded modules)."""

MAX_CHUNK = 32
"""The most items the pool sends a worker in one message (`WorkerPool._chunk_size`)."""

MAX_RESULT_BYTES = 1 << 20
"""The largest result a worker may send back (JSON, bytes); a longer one is an error (`on_error`)."""

DEFAULT_LIMITS = Limits()
"""A worker's OS limits unless the caller gives its own (`Limits`' defaults)."""

_PRELOAD: list[str] = []
"""Every pool's preload so far, in order: the fork server is one per process and imports what was asked before it
started; modules a later pool names are imported by each of its workers itself (a slower start, same behaviour)."""

_WARNED = False


def default_timeout(timeout_s: float) -> dict[str, Any]:
    """The default result of an item not answered within `timeout_s` seconds:
    ``{"error": "TimeoutError: no result within <t> s", "timeout": True}``."""
    return {"error": f"TimeoutError: no result within {timeout_s:g} s", "timeout": True}


def default_error(why: str) -> dict[str, Any]:
    """The default result of an item whose worker died, raised, or sent something `check` refused: ``{"error": why}``."""
    return {"error": why}


def default_check(value: Any) -> Any:
    """The default reader of a worker's result: any JSON value, as it is."""
    return value


def _json_value(x: Any) -> Any:
    """A value JSON cannot carry, as it can (a numpy scalar as its value, anything else as text)."""
    item = getattr(x, "item", None)
    return item() if callable(item) else str(x)


_ENCODER = json.JSONEncoder(default=_json_value)
"""`json.dumps(..., default=_json_value)` without building an encoder per call (a microsecond per item)."""


def _send_json(conn: Connection, obj: Any) -> None:
    conn.send_bytes(_ENCODER.encode(obj).encode())


def _close_inherited_fds(keep: int) -> None:
    """Close every descriptor but stdio and `keep` (the pipe to the pool): what the fork server hands its children
    (its alive pipe, the resource tracker's pipe) would let code in the worker ask those unconfined helpers for a
    new process or for a file to be unlinked (review of issue 42, M2)."""
    from multiprocessing import resource_tracker

    resource_tracker._resource_tracker._fd = None  # closed below; the worker never tracks a resource
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 4096)


def _worker(conn: Connection, target: Target, timeout_s: float, workdir: str, limits: Limits) -> None:
    """A worker's life: confine itself, report the missing layers (a JSON list of lines), then answer each item of
    each chunk with one JSON message, ``{"result": ...}`` or ``{"error": "<ExceptionType>: <message>"}`` when
    `target` raised, until the pipe closes or brings None."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the pool ends it (see the module docstring)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C too: no traceback; the caller decides
    from dapo_rl.sandbox.confinement import confine, cpu_budget

    _close_inherited_fds(conn.fileno())
    _send_json(conn, confine(workdir, limits).missing())
    while True:
        try:
            msg = conn.recv()  # from the pool, which the worker trusts (not the other way round)
        except (EOFError, OSError):
            return
        if msg is None:
            return
        chunk, options = msg
        for item in chunk:  # each result is sent as soon as it is made (the deadlines)
            cpu_budget(2 * timeout_s)  # a backstop: the pool kills it at timeout_s of wall time
            try:
                out = _ENCODER.encode({"result": target(item, options)})
            except Exception as e:  # the item's error, not the worker's: it answers the next one
                out = _ENCODER.encode({"error": f"{type(e).__name__}: {e}"})
            conn.send_bytes(out.encode())


class Worker:
    """One confined worker process.

    Attributes:
        proc: the `multiprocessing` process.
        conn: the pool's end of its pipe.
        workdir: its temporary directory (the only place it may write), removed by `kill`.
        jobs: indices of the items sent and not answered yet, the one being run first.
        started: `time.monotonic()` when the first of `jobs` began (its chunk was sent or the previous result came).
        missing: the confinement layers the OS did not give (after `ready`).
    """

    def __init__(self, ctx, target: Target, timeout_s: float, limits: Limits, name: str):
        self.name = name
        self.workdir = tempfile.mkdtemp(prefix=f"dapo-{name}-")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_worker, args=(child, target, timeout_s, self.workdir, limits), daemon=True
        )
        self.proc.start()
        children.register(self.proc)
        child.close()
        self.jobs: deque[int] = deque()
        self.started = 0.0
        self.missing: list[str] | None = None

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait for the worker to confine itself; warn once per process about layers the OS did not give.

        Args:
            timeout_s: seconds to wait.

        Raises:
            RuntimeError: it died or did not answer in time (it is killed).
        """
        global _WARNED
        try:
            if not self.conn.poll(timeout_s):
                raise RuntimeError(f"a {self.name} worker did not start within {timeout_s:.0f} s")
            missing = json.loads(self.conn.recv_bytes(MAX_RESULT_BYTES))
            if not isinstance(missing, list) or not all(isinstance(x, str) for x in missing):
                raise ValueError("not a list of lines")
            self.missing = missing
        except (EOFError, OSError, ValueError) as e:
            self.kill()
            raise RuntimeError(
                f"a {self.name} worker died while starting (exit code {self.proc.exitcode})"
            ) from e
        except RuntimeError:
            self.kill()
            raise
        if self.missing and not _WARNED:
            _WARNED = True
            warnings.warn(
                f"{self.name} workers run with fewer OS limits than they could: " + "; ".join(self.missing),
                RuntimeWarning,
                stacklevel=3,
            )

    def kill(self) -> None:
        """SIGKILL the process (if alive), reap it, close the pipe, remove the directory; idempotent."""
        children.kill(self.proc)
        self.conn.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class WorkerPool(Generic[R]):
    """Runs `target(item, options)` on batches of items in `num_workers` confined processes, each item bounded by
    `timeout_s` seconds of wall time (see the module docstring).

    Args:
        target: `target(item, options) -> JSON-able result`, run in a worker; an importable top-level function or a
            `functools.partial` of one (it is pickled by reference, and its module imported in the worker before
            the worker confines itself).
        num_workers: worker processes, >= 1.
        timeout_s: seconds of wall time one item may take, finite and > 0; past it the worker is killed. Each item
            also gets ``2 * timeout_s`` seconds of CPU time (``RLIMIT_CPU``).
        check: `check(value) -> result`: reads a worker's result, already parsed from JSON (never unpickled);
            raises `ValueError` to refuse it (the item gets ``on_error("ValueError: <message>")`` and the worker,
            no longer trusted, is replaced). Default: the value as it is.
        on_timeout: `on_timeout(timeout_s) -> result` for an item not answered in time (default
            `default_timeout`).
        on_error: `on_error(why) -> result` for an item whose worker died (``"worker died"``), sent a result over
            `max_result_bytes` (``"result longer than <n> bytes"``), sent something `check` refused, or whose
            `target` raised (``"<ExceptionType>: <message>"``; that worker goes on). Default `default_error`.
        preload: modules the fork server imports once, after `SANDBOX_PRELOAD`, so that every worker (and every
            replacement) starts warm; effective for the pools created before the process's fork server starts.
        limits: the OS limits of each worker (`Limits`).
        name: what the workers are called in messages and in their directories' names (``a <name> worker did not
            start ...``, ``<name> workers run with fewer OS limits ...``, ``dapo-<name>-*``).
        max_result_bytes: the largest result a worker may send, bytes.

    Use as a context manager or call `close()`.

    Raises:
        ValueError: `num_workers` < 1, or `timeout_s` not a finite number > 0.
        RuntimeError: a worker died or did not start within `READY_TIMEOUT_S` (all are stopped).
    """

    def __init__(
        self,
        target: Target,
        num_workers: int,
        timeout_s: float,
        *,
        check: Callable[[Any], R] = default_check,
        on_timeout: Callable[[float], R] = default_timeout,
        on_error: Callable[[str], R] = default_error,
        preload: Iterable[str] = (),
        limits: Limits = DEFAULT_LIMITS,
        name: str = "sandbox",
        max_result_bytes: int = MAX_RESULT_BYTES,
    ):
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers} must be >= 1")
        if not 0 < timeout_s < float("inf"):  # NaN fails both: it would time every item out
            raise ValueError(f"timeout_s={timeout_s} must be a finite number > 0")
        self.target, self.timeout_s, self.limits, self.name = target, timeout_s, limits, name
        self.check, self.on_timeout, self.on_error = check, on_timeout, on_error
        self.max_result_bytes = max_result_bytes
        for module in [*SANDBOX_PRELOAD, *preload]:
            if module not in _PRELOAD:
                _PRELOAD.append(module)
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(_PRELOAD))
        self.workers: list[Worker] = []
        """The live workers, in the order they take chunks (a replacement takes its predecessor's place)."""
        try:
            for _ in range(num_workers):
                self.workers.append(self._start())
            for w in self.workers:  # started side by side above, confined each on its own
                w.ready()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> WorkerPool[R]:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> Worker:
        return Worker(self._ctx, self.target, self.timeout_s, self.limits, self.name)

    def close(self) -> None:
        """Stop the workers (each gets a second to finish, then is killed) and remove their directories; idempotent."""
        workers, self.workers = self.workers, []
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

    def run(self, items: Sequence[Any], options: Any = None) -> list[R]:
        """Run `target(item, options)` on every item; results come back in the items' order. Never raises on what
        a worker does or sends.

        Args:
            items: picklable items (sent to the workers, which trust the pool).
            options: one picklable value passed with every item of this call (None: ``{}``).

        Returns:
            One result per item: `check`'s reading of what `target` returned, `on_timeout(timeout_s)` for an item
            not answered in time, or `on_error(why)` (see the class).

        Raises:
            RuntimeError: the pool is closed (and `items` not empty) or was closed by another thread during the run,
                or a replacement worker did not start (`Worker.ready`).
        """
        if items and not self.workers:  # the loop below would wait for a worker forever
            raise RuntimeError(f"the {self.name} pool is closed")
        options = {} if options is None else options
        results: list[Any] = [None] * len(items)
        pending = deque(range(len(items)))
        while pending or any(w.jobs for w in self.workers):
            if not self.workers:  # closed from another thread (a failing trainer): nothing will answer
                raise RuntimeError(f"the {self.name} pool was closed during a run")
            for w in self.workers:
                if not w.jobs and pending:
                    chunk = [pending.popleft() for _ in range(self._chunk_size(len(pending)))]
                    w.jobs.extend(chunk)
                    w.started = time.monotonic()
                    try:
                        w.conn.send(([items[i] for i in chunk], options))
                    except (
                        OSError
                    ):  # it died while idle (out of memory): a fresh one takes the chunk next round
                        self._replace(w, pending)
            busy = [w for w in self.workers if w.jobs]
            if not busy:
                continue
            next_deadline = min(w.started + self.timeout_s for w in busy)
            try:
                ready = wait([w.conn for w in busy], timeout=max(0.0, next_deadline - time.monotonic()))
            except (OSError, ValueError):  # a pipe closed under us: by `close`, or a broken pipe
                if not self.workers:
                    raise RuntimeError(f"the {self.name} pool was closed during a run") from None
                raise
            for w in busy:
                if w.conn in ready:
                    idx = w.jobs.popleft()
                    w.started = time.monotonic()
                    results[idx] = self._receive(w, pending)
                elif time.monotonic() - w.started >= self.timeout_s:
                    results[w.jobs.popleft()] = self.on_timeout(self.timeout_s)
                    self._replace(w, pending)
        return results

    def _receive(self, w: Worker, pending: deque[int]) -> R:
        """The result of `w`'s first job, read from its pipe as JSON; a worker that died, sent too much or sent
        something refused is replaced."""
        try:
            msg = json.loads(w.conn.recv_bytes(self.max_result_bytes))
            if type(msg) is dict and len(msg) == 1:  # (per item: the microsecond targets feel each check)
                if "result" in msg:
                    return self.check(msg["result"])
                if "error" in msg:  # `target` raised; the worker goes on
                    return self.on_error(str(msg["error"]))
            raise ValueError(f"a {self.name} worker sent something that is not a result message")
        except (EOFError, OSError) as e:  # it died (out of memory, native code), or sent too much
            # (multiprocessing's "bad message length": the pipe is out of step after it)
            too_long = "message length" in str(e)
            why = f"result longer than {self.max_result_bytes} bytes" if too_long else "worker died"
        except ValueError as e:  # not JSON, not a result message, or refused by `check`
            why = f"ValueError: {e}"
        self._replace(w, pending)
        return self.on_error(why)

    def _chunk_size(self, pending: int) -> int:
        """Items sent to a worker in one message: up to `MAX_CHUNK`, a quarter of each worker's share of what is
        left, so that the workers finish together while microsecond targets do not pay a pipe round trip per item.
        Each item keeps its own deadline (its chunk's send or the previous item's result)."""
        return min(pending, max(1, min(MAX_CHUNK, pending // (4 * len(self.workers)))))

    def _replace(self, w: Worker, pending: deque[int]) -> None:
        """Kill `w` and start a fresh worker in its place; the items it was sent and never answered go back to the
        front of `pending`.

        Raises:
            RuntimeError: the fresh worker did not start.
        """
        pending.extendleft(reversed(w.jobs))
        w.jobs.clear()
        w.kill()
        if w not in self.workers:  # the pool was closed during the run (`close` killed it)
            raise RuntimeError(f"the {self.name} pool was closed during a run")
        i = self.workers.index(w)
        self.workers[i] = self._start()
        self.workers[i].ready()
