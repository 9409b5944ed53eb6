"""The embedded warm-up with one padded pass per batch against length-sorted micro-batches (`sft.micro_batch_size`),
side by side in one run: the recipe's first `--steps` optimizer steps, alternating the two settings `--rounds`
times, each into its own temporary directory.

Prints the seconds per step of each (median over the rounds), the loss each logged at its last step (the same
batches and gradient, so the two agree to rounding), and the micro-batched / one-pass time ratio. A time holds only
with its machine: compare the ratio, not the seconds.

    python benchmarks/sft_micro_batches.py                          # the default recipe's warm-up, 100 steps x 2
    python benchmarks/sft_micro_batches.py --recipe tiny_chain_sum --micro-batch-size 32 --steps 50
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import replace

from dapo_rl.config import load_config
from dapo_rl.sft import run_sft


def one(sft, micro: int, steps: int) -> tuple[float, float]:
    """Seconds per step of the training loop (the data set-up excluded) and the last logged loss of `steps` warm-up
    steps with `micro_batch_size=micro`."""
    losses: list[float] = []
    seconds: list[float] = []

    def log(line: str) -> None:
        if line.startswith("sft step"):  # "sft step  N/M  loss L  Ts": T counts from the first step
            losses.append(float(line.split("loss")[1].split()[0]))
            seconds.append(float(line.rsplit(None, 1)[1].rstrip("s")))

    with tempfile.TemporaryDirectory() as d:
        run_sft(replace(sft, steps=steps, micro_batch_size=micro, output_dir=d), log=log)
    return seconds[-1] / steps, losses[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--recipe", default=None, help="recipe whose `sft` settings to use (default: the embedded default)"
    )
    ap.add_argument("--micro-batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sft = load_config(args.recipe).sft
    settings = (0, args.micro_batch_size)
    times: dict[int, list[float]] = {m: [] for m in settings}
    last: dict[int, float] = {}
    for r in range(args.rounds):
        for micro in settings if r % 2 == 0 else settings[::-1]:
            s, loss = one(sft, micro, args.steps)
            times[micro].append(s)
            last[micro] = loss
            print(f"round {r}: micro_batch_size={micro}  {s:.3f} s/step  loss {loss:.4f}", flush=True)
    for micro in settings:
        print(
            f"micro_batch_size={micro}: median {statistics.median(times[micro]):.3f} s/step, last loss {last[micro]:.4f}"
        )
    ratio = statistics.median(times[settings[1]]) / statistics.median(times[0])
    print(f"micro-batched / one pass, time per step: {ratio:.2f}")


if __name__ == "__main__":
    main()
