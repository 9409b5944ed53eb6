"""Synchronous against asynchronous DAPO, side by side on this machine: `dapo train RECIPE` with
`async_training.max_staleness=0` and `=K`, same seed, same steps, run one after the other (alternating over
`--rounds`), and the ratio of their seconds per step.

    python benchmarks/async_overlap.py                       # tiny_chain_sum, 100 steps, K = 1
    python benchmarks/async_overlap.py --recipe smollm2_chain_sum --steps 10 --test-freq 10 --k 1

Prints, per run: wall seconds, mean seconds per step (steps 2.., the first fills the queue), the trainer's wait for
data, generation / update seconds per step, `async/overlap_ratio` (the share of the update + weight hand-off during
which the engine process was generating), staleness and dropped groups, sampled responses, and held-out accuracy
at the last validation; then K's seconds per step over K = 0's. Extra `key=value` arguments go to both runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(recipe: str, k: int, steps: int, test_freq: int, out: Path, extra: list[str]) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "dapo_rl.cli",
        "train",
        recipe,
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={test_freq}",
        f"trainer.output_dir={out}",
        "trainer.progress_bar=false",
        f"async_training.max_staleness={k}",
        *extra,
    ]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"K={k}: dapo train failed ({r.returncode}):\n{r.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in rows if x["step"] > 0]
    later = train[1:] or train

    def mean(key: str, rows=later) -> float:
        vals = [x[key] for x in rows if key in x]
        return statistics.fmean(vals) if vals else float("nan")

    val = [x for x in rows if any(k.endswith("/acc") and k.startswith("val/") for k in x)]
    acc = {k: v for k, v in val[-1].items() if k.startswith("val/") and k.endswith("/acc")} if val else {}
    return {
        "k": k,
        "wall_s": wall,
        "step_s": mean("time/step_s"),
        "wait_s": mean("time/wait_s"),
        "generate_s": mean("time/generate_s"),
        "update_s": mean("time/update_s") + mean("time/old_log_prob_s"),
        "overlap": mean("async/overlap_ratio"),
        "staleness": mean("async/staleness_mean", train),
        "dropped": sum(x.get("async/dropped_stale_groups", 0) for x in train),
        "samples": train[-1]["train/gen_samples_total"],
        "val": acc,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="tiny_chain_sum")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--test-freq", type=int, default=50)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="alternating K=0 / K runs each")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary directory)")
    ap.add_argument("extra", nargs="*", help="key=value overrides for both runs")
    a = ap.parse_args()
    root = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="dapo_async_"))
    results: dict[int, list[dict]] = {0: [], a.k: []}
    for i in range(a.rounds):
        for k in (0, a.k):
            res = run(a.recipe, k, a.steps, a.test_freq, root / f"k{k}_{i}", a.extra)
            results[k].append(res)
            val = ", ".join(f"{n} {v:.3f}" for n, v in res["val"].items())
            if k == 0:  # the synchronous loop neither waits for a queue nor overlaps
                res |= {"wait_s": 0.0, "overlap": 0.0, "staleness": 0.0}
            print(
                f"K={k}: wall {res['wall_s']:.0f} s, {res['step_s']:.2f} s/step (wait {res['wait_s']:.2f}, generate "
                f"{res['generate_s']:.2f}, update {res['update_s']:.2f}), overlap {res['overlap']:.2f}, staleness "
                f"{res['staleness']:.2f}, dropped {res['dropped']} groups, {res['samples']} samples; held out {val}",
                flush=True,
            )
    s0 = statistics.fmean(r["step_s"] for r in results[0])
    sk = statistics.fmean(r["step_s"] for r in results[a.k])
    w0 = statistics.fmean(r["wall_s"] for r in results[0])
    wk = statistics.fmean(r["wall_s"] for r in results[a.k])
    print(
        f"K={a.k} over K=0: seconds per step {sk / s0:.2f}x, wall {wk / w0:.2f}x ({a.recipe}, {a.steps} steps)"
    )


if __name__ == "__main__":
    main()
