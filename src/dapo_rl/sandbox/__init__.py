"""The sandbox: where anything that handles model output runs, confined, with limits and a deadline.

Two rooms, for any caller:

- `dapo_rl.sandbox.confinement`: OS confinement of one process (`confine`, `cpu_budget`, `Limits`, `Confinement`):
  no writes outside its own directory, no network, no child processes, no exec, memory/file/CPU limits.
- `dapo_rl.sandbox.workers`: a pool of such processes (`WorkerPool`) running a caller's importable function on
  items: isolation (fresh forkserver children, inherited descriptors closed), a hard per-item wall-clock deadline
  (SIGKILL, a fresh worker, the unreached items sent again), results read back as JSON data, never unpickled.
- `dapo_rl.sandbox.program`: whole Python programs that a model wrote (`ProgramRunner`, `ProgramLimits`,
  `ProgramResult`): each in a child of a template process that never held the caller's environment or memory, in
  namespaces of its own, reading only the Python installation, its output capped, killed at its wall time; the
  status read back by the parent. The Python tool and code rewards call it; `dapo sandbox -c CODE` too.

It knows nothing of rewards: the reward pool (`dapo_rl.reward.pool`) is one caller, handing in its scorer and
deciding what a timeout or a dead worker scores.
"""

from dapo_rl.sandbox.confinement import Confinement, Limits, confine, cpu_budget, python_install_paths
from dapo_rl.sandbox.program import STATUSES, ProgramLimits, ProgramResult, ProgramRunner
from dapo_rl.sandbox.workers import (
    MAX_CHUNK,
    MAX_RESULT_BYTES,
    READY_TIMEOUT_S,
    Worker,
    WorkerPool,
)

__all__ = [
    "MAX_CHUNK",
    "MAX_RESULT_BYTES",
    "READY_TIMEOUT_S",
    "STATUSES",
    "Confinement",
    "Limits",
    "ProgramLimits",
    "ProgramResult",
    "ProgramRunner",
    "Worker",
    "WorkerPool",
    "confine",
    "cpu_budget",
    "python_install_paths",
]
