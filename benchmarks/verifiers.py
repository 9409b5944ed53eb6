"""Throughput of each verifier on the 800 real labelled responses (MATH, Qwen2.5-Math CoT), 1 and 2 workers.

Run: python benchmarks/verifiers.py [--data ../shared/data/responses_math_cot_100/math_cot_100.jsonl]

Prints responses/s per verifier and worker count, measured side by side in one run, plus the agreement of `acc` with
the file's correctness labels. `reasoning_gym` has no math responses to score, so it is measured on 800 reasoning-gym
chain_sum responses ("Answer: N", a third of them wrong) instead.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from dapo_rl.data import reasoning_gym_samples
from dapo_rl.reward.pool import RewardPool

DEFAULT = (
    Path(__file__).resolve().parents[2] / "shared" / "data" / "responses_math_cot_100" / "math_cot_100.jsonl"
)


def load_items(path: Path) -> tuple[list[tuple], list[bool]]:
    items, labels = [], []
    for line in path.read_text().splitlines():
        row = json.loads(line)
        for resp, label in zip(row["response"], row["score"]):
            items.append(("math", resp, row["gt"], None))
            labels.append(bool(label))
    return items, labels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT)
    args = ap.parse_args()
    items, labels = load_items(args.data)
    rg = reasoning_gym_samples("chain_sum", len(items), 5, {"min_terms": 2, "max_terms": 3})
    rg_items = [
        (s.data_source, f"Answer: {s.ground_truth if i % 3 else '0'}", s.ground_truth, s.extra_info)
        for i, s in enumerate(rg)
    ]
    print(f"{'verifier':<16}{'workers':>8}{'responses/s':>14}{'agreement with labels':>24}")
    for verifier, batch in (("math", items), ("math_dapo", items), ("reasoning_gym", rg_items)):
        for workers in (1, 2):
            with RewardPool(verifier, num_workers=workers, timeout_s=5.0) as pool:
                pool.score(batch[:4])  # warm the workers
                t0 = time.perf_counter()
                res = pool.score(batch)
                rate = len(batch) / (time.perf_counter() - t0)
            agree = (
                f"{sum(bool(r['acc']) == lab for r, lab in zip(res, labels))}/{len(labels)}"
                if batch is items
                else "-"
            )
            print(f"{verifier:<16}{workers:>8}{rate:>14.1f}{agree:>24}")


if __name__ == "__main__":
    main()
