"""One process against N ranks on the same work, side by side in one run: `dapo train` of a recipe (default: the
embedded default, 300 steps) with 1 process and with `trainer.nproc_per_node=N`, one after the other on this machine.

Prints, for each: wall time (launch to exit, the embedded base model already built), median step time
(`time/step_s`, steps with validation excluded), the first and last `val/<task>/acc`, and the N-rank / 1-process
ratios. A time holds only with its machine: compare the ratio, not the seconds.

    python benchmarks/data_parallel.py                                  # the embedded default, 1 vs 2 ranks
    python benchmarks/data_parallel.py --nproc 2 trainer.total_training_steps=50
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(out: Path, overrides: list[str], nproc: int) -> dict:
    """Train into `out` with `nproc` ranks; return wall time, median step time and validation accuracy."""
    cmd = [sys.executable, "-m", "dapo_rl.cli", "train", *overrides, f"trainer.output_dir={out}"]
    cmd += [f"trainer.nproc_per_node={nproc}", "trainer.progress_bar=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["time/step_s"] for r in rows if r["step"] > 0 and not any(k.startswith("val/") for k in r)]
    val = [(r["step"], v) for r in rows for k, v in r.items() if k.startswith("val/") and k.endswith("/acc")]
    return {
        "nproc": nproc,
        "wall_s": wall,
        "median_step_s": statistics.median(steps),
        "val_first": val[0],
        "val_last": val[-1],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks of the data-parallel run (default 2)")
    p.add_argument("--out", default="runs/bench_data_parallel", help="parent of the two run directories")
    p.add_argument("overrides", nargs="*", help="dotted overrides for both runs")
    args = p.parse_args()
    root = Path(args.out)
    if root.exists():
        raise SystemExit(f"{root} exists; remove it or pass --out")
    from dapo_rl.config import load_config
    from dapo_rl.sft import ensure_embedded_model

    cfg = load_config(None, args.overrides)
    if cfg.model.path == "embedded":  # build (or find cached) the base model before timing anything
        ensure_embedded_model(cfg.sft)
    results = [run(root / f"nproc{n}", args.overrides, n) for n in (1, args.nproc)]
    print(f"{'ranks':>5} {'wall s':>9} {'median step s':>14} {'val acc first -> last':>28}")
    for r in results:
        (s0, a0), (s1, a1) = r["val_first"], r["val_last"]
        print(
            f"{r['nproc']:>5} {r['wall_s']:>9.1f} {r['median_step_s']:>14.3f}    step {s0}: {a0:.3f} -> step {s1}: {a1:.3f}"
        )
    one, many = results
    print(
        f"ratio {args.nproc} ranks / 1 process: wall {many['wall_s'] / one['wall_s']:.2f}, median step "
        f"{many['median_step_s'] / one['median_step_s']:.2f}"
    )


if __name__ == "__main__":
    main()
