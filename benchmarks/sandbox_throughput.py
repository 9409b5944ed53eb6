"""Throughput of the program sandbox (`dapo_rl.sandbox.ProgramRunner`): calls/s with 1 and 2 workers, side by side.

Run: python benchmarks/sandbox_throughput.py [--calls 200] [--rounds 3]

Two programs: ``print(1+1)`` (the per-call cost of the sandbox itself: fork, confinement, pipes, reaping) and a
10,000-iteration loop. Both runners start first; then, each round, every (program, workers) cell runs `--calls`
programs in one `run`, the cells interleaved, so that both worker counts see the same machine load. Prints the
median calls/s per cell, the ratio 2 workers / 1, the per-call wall time with 1 worker, and for reference a fresh
``python -I -c`` process per call (what a sandbox without templates would pay at least).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from dapo_rl.sandbox import ProgramLimits, ProgramRunner

PROGRAMS = {
    "print(1+1)": "print(1+1)",
    "10k-iteration loop": "s = 0\nfor i in range(10_000):\n    s += i * i\nprint(s)",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200, help="programs per cell per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    limits = ProgramLimits(wall_s=10.0)
    rates: dict[tuple[str, int], list[float]] = {(p, w): [] for p in PROGRAMS for w in (1, 2)}
    with ProgramRunner(1, limits) as one, ProgramRunner(2, limits) as two:
        runners = {1: one, 2: two}
        for r in runners.values():  # warm-up
            r.run([PROGRAMS["print(1+1)"]] * 10)
        for _ in range(args.rounds):
            for name, code in PROGRAMS.items():
                for w, runner in runners.items():
                    t0 = time.perf_counter()
                    res = runner.run([code] * args.calls)
                    dt = time.perf_counter() - t0
                    bad = [x for x in res if x.status != "ok"]
                    if bad:
                        raise SystemExit(f"{name} with {w} workers: {bad[0]}")
                    rates[(name, w)].append(args.calls / dt)
        layers = one.layers
    n = max(20, args.calls // 10)
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run([sys.executable, "-I", "-c", "print(1+1)"], check=True, capture_output=True)
    fresh = n / (time.perf_counter() - t0)
    print(
        f"layers: {', '.join(k for k, v in layers.items() if v)}; {args.calls} calls x {args.rounds} rounds"
    )
    print(f"{'program':<20} {'1 worker':>10} {'2 workers':>10} {'ratio':>7} {'ms/call (1w)':>13}")
    for name in PROGRAMS:
        a, b = statistics.median(rates[(name, 1)]), statistics.median(rates[(name, 2)])
        print(f"{name:<20} {a:>10.1f} {b:>10.1f} {b / a:>7.2f} {1000 / a:>13.2f}")
    print(f"{'python -I -c, fresh':<20} {fresh:>10.1f} {'':>10} {'':>7} {1000 / fresh:>13.2f}  (reference)")


if __name__ == "__main__":
    main()
