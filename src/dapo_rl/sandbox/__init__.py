"""The sandbox: where anything that handles model output runs, confined and limited.

- `dapo_rl.sandbox.confinement`: OS confinement of one process (`confine`, `cpu_budget`, `Limits`, `Confinement`):
  no writes outside its own directory, no network, no child processes, no exec, memory/file/CPU limits.

It knows nothing of rewards.
"""

from dapo_rl.sandbox.confinement import Confinement, Limits, confine, cpu_budget

__all__ = ["Confinement", "Limits", "confine", "cpu_budget"]
