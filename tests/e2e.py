"""Helpers for the tests that run the real `dapo` command in a subprocess."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

FAULT = "DAPO_RL_FAULT_AT"
"""Faults for a crash test to inject (`tests/faultinject/sitecustomize.py` says which and where)."""

FAULTINJECT = Path(__file__).resolve().parent / "faultinject"

TEST_RECIPE = "tiny_chain_sum"
"""The recipe the tests' `dapo train` / `dapo sft` runs use unless they name one: bare answers to two- and
three-term sums, a warm-up of seconds (the embedded default, `tiny_chain_steps`, writes worked steps and warms up
for minutes)."""


def with_recipe(args: tuple[str, ...] | list[str]) -> list[str]:
    """`args` with `TEST_RECIPE` after `train` / `sft` when they name no recipe (the next argument is a `key=value`
    override or a flag, or there is none)."""
    args = list(args)
    if args and args[0] in ("train", "sft") and (len(args) == 1 or "=" in args[1] or args[1].startswith("-")):
        args.insert(1, TEST_RECIPE)
    return args


def dapo(*args, cwd=None, env_extra=None):
    """Run `python -m dapo_rl.cli ARGS` and return the completed process (text output captured). With `FAULT` in
    `env_extra`, the child (and its ranks) also get `tests/faultinject` first on `PYTHONPATH`, which installs the
    faults."""
    env = dict(os.environ, **(env_extra or {}))
    if FAULT in (env_extra or {}):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAULTINJECT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "dapo_rl.cli", *with_recipe(args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=900,
    )


def rows_of(run: Path) -> list[dict]:
    """The rows of a run's metrics.jsonl."""
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def run_args(base_model: Path, run: Path, *extra: str) -> list[str]:
    return [
        "train",
        TEST_RECIPE,
        f"model.path={base_model}",
        f"trainer.output_dir={run}",
        "data.train_reasoning_gym.size=500",
        "data.val_reasoning_gym.size=32",
        "data.train_batch_size=8",
        "data.gen_batch_size=16",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=4",  # two optimizer steps per training step
        "actor.autocast_dtype=none",  # fp32 whatever the machine: these runs are compared across rank counts
        "model.attn_implementation=sdpa",  # no timing probe: the same kernel in every run compared
        "trainer.total_training_steps=6",
        "trainer.test_freq=3",
        "trainer.save_freq=2",
        "trainer.max_ckpt_to_keep=2",
        "algorithm.filter_groups.on_exhausted=partial",
        "trainer.progress_bar=false",
        *extra,
    ]


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics rows without wall-clock timings and throughputs."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


def assert_same_metrics(got: list[dict], want: list[dict]) -> None:
    """Same steps, same keys, every value within 1e-6 (NaN matches NaN); prints the largest difference."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    worst = 0.0
    for g, w in zip(comparable(got), comparable(want)):
        assert g.keys() == w.keys(), (g["step"], set(g) ^ set(w))
        for k in w:
            a, b = g[k], w[k]
            if isinstance(b, float) and math.isnan(b):
                assert math.isnan(a), (g["step"], k)
            else:
                assert a == pytest.approx(b, abs=1e-6, rel=0), (g["step"], k, a, b)
                worst = max(worst, abs(a - b))
    print(f"resumed vs uninterrupted: {len(want)} rows, largest metric difference {worst:.3g}")


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """Whether process `pid` has ended (a zombie counts as ended) within `wait_s` seconds."""
    import time

    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().split(") ")[1].startswith("Z"):
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.2)
    return False
