"""Targets for the sandbox's worker-pool tests (`tests/test_sandbox_workers.py`): importable top-level functions, so
that the fork server's children can unpickle them by reference; and `threads_named`, which the program-sandbox
tests use to find a confined program from outside. Nothing here is about rewards."""

import os
import sys
import time
from fractions import Fraction
from pathlib import Path


def threads_named(name: str) -> list[str]:
    """The /proc/<pid>/task/<tid> of every thread on the machine whose name (comm) is `name` (a program in the
    sandbox names itself with `prctl(PR_SET_NAME)` so that a test can find it)."""
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                if Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip() == name:
                    hits.append(f"/proc/{pid}/task/{tid}")
            except OSError:
                continue
    return hits


def act(item, options):
    """Do what `item` (``(action, value)``) says, in a worker:

    - ``("echo", x)``: ``{"echo": x, "options": options, "pid": <the worker's pid>}``;
    - ``("sleep", s)``: sleep `s` seconds of wall time (no CPU), then echo;
    - ``("die", code)``: end the worker's process at once (``os._exit``), as a crash in native code would;
    - ``("huge", n)``: a result of `n` bytes of text;
    - ``("raise", message)``: raise ``ValueError(message)``;
    - ``("not_json", _)``: values JSON cannot carry (a fraction, a set);
    - ``("where", path)``: where the worker runs and what it may do: its directory, its open descriptors, whether
      it can write `path` (outside its directory), and the `dapo_rl` modules it has imported.
    """
    action, value = item
    if action == "sleep":
        time.sleep(value)
    elif action == "die":
        os._exit(value)
    elif action == "huge":
        return "x" * value
    elif action == "raise":
        raise ValueError(value)
    elif action == "not_json":
        return {"fraction": Fraction(1, 3), "set": {7}}
    elif action == "where":
        try:
            with open(value, "w") as f:
                f.write("x")
            write_outside = "ok"
        except OSError as e:
            write_outside = type(e).__name__
        return {
            "cwd": os.getcwd(),
            "pid": os.getpid(),
            "fds": inherited_fds(),
            "write_outside": write_outside,
            "dapo_rl_modules": sorted(m for m in sys.modules if m.startswith("dapo_rl")),
        }
    return {"echo": value, "options": options, "pid": os.getpid()}


def inherited_fds() -> list[int]:
    """This process's open descriptors above 2 (the listing's own descriptor is closed again once it returns)."""
    return [fd for fd in map(int, os.listdir("/proc/self/fd")) if fd > 2 and _open(fd)]


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False
