"""Child processes that never outlive the run: every process the run starts is registered here and killed at exit.

The reward pool's workers and the asynchronous engine processes ignore SIGTERM and SIGINT (the trainer stops them
itself at a step boundary, or at once on a second Ctrl-C). CPython's own exit hook for multiprocessing (``multiprocessing.util._exit_function``) sends SIGTERM
to daemonic children and then joins them without a deadline, so a run that ended by an uncaught error while such a
child was alive would hang at exit forever. `register` adds a child to a registry whose ``atexit`` hook, registered
after multiprocessing's and so run before it (``atexit`` is last in, first out), kills (SIGKILL) and joins, with a
deadline, every registered child still alive. Owners still close their children normally; this is the path for
every exit they did not see.
"""

from __future__ import annotations

import atexit
import threading
import weakref

KILL_JOIN_S = 5.0
"""Seconds to wait for a killed child to be reaped."""

_LOCK = threading.Lock()
_CHILDREN: weakref.WeakSet = weakref.WeakSet()
_REGISTERED = False


def register(proc) -> None:
    """Kill `proc` (a started `multiprocessing.Process`) at interpreter exit if it is still alive then."""
    global _REGISTERED
    import multiprocessing.util  # noqa: F401 (its exit hook must be registered before ours, to run after it)

    with _LOCK:
        _CHILDREN.add(proc)
        if not _REGISTERED:
            atexit.register(kill_all)
            _REGISTERED = True


def unregister(proc) -> None:
    """`proc` was closed by its owner."""
    with _LOCK:
        _CHILDREN.discard(proc)


def kill(proc, join_s: float = KILL_JOIN_S) -> None:
    """SIGKILL `proc` if it is alive, and reap it (at most `join_s` seconds)."""
    try:
        if proc.is_alive():
            proc.kill()
        proc.join(join_s)
    except (AssertionError, ValueError, OSError):  # not started, already closed, or not our child
        pass
    unregister(proc)


def kill_all() -> None:
    """Kill every registered child still alive (the ``atexit`` hook; also safe to call directly)."""
    with _LOCK:
        procs = list(_CHILDREN)
    for p in procs:
        kill(p)
