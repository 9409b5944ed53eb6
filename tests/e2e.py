"""Helpers for the tests that run the real `dapo` command in a subprocess."""

import json
import os
import subprocess
import sys
from pathlib import Path


def dapo(*args, cwd=None, env_extra=None):
    """Run `python -m dapo_rl.cli ARGS` and return the completed process (text output captured)."""
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "dapo_rl.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
    )


def rows_of(run: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
