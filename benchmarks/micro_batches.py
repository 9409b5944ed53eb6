"""Training tokens/s of token-budget micro-batches against padded fixed-size ones, same sequences, side by side.

One `Actor.update` (forward + backward + optimizer step) over the same batch of sequences in three ways:

- `padded`: `actor.ppo_micro_batch_size` rows at a time in batch order, each micro-batch padded to its longest row
  (what the trainer did before `use_dynamic_bsz`);
- `budget`: `actor.use_dynamic_bsz` with padded forwards: rows of similar length together, each micro-batch at
  most `ppo_max_token_len_per_gpu` tokens counting padding (budget: twice the longest sequence, verl's rule of
  thumb of 2-3x (prompt + response); below the baseline's largest micro-batch, so peak memory is lower too);
- `budget+packed`: the same budget with `actor.use_remove_padding` (sequences packed into one row).

Length spreads (byte tokenizer, one token per byte): `dapo`, prompts from DAPO-Math-17k and responses from the
labelled Qwen2.5-Math CoT responses (MATH), both divided by 4 so that a CPU run takes a minute; `embedded`, the
embedded default's chain_sum prompts with responses of 1-24 tokens. The model is Qwen2-shaped (hidden 256, 4 layers,
random init). Each way runs `--repeats` times, interleaved; the median is reported, with the ratio to `padded` and
the largest difference of `actor/pg_loss` (the same gradient up to float summation order).

    python benchmarks/micro_batches.py [--rows 64] [--micro 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig
from dapo_rl.models.tiny import save_tiny_checkpoint

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def dapo_lengths(rows: int) -> list[tuple[int, int]]:
    prompts = pq.read_table(DATA / "dapo_math_17k" / "dapo_math_17k.parquet", columns=["prompt"]).column(0)
    responses = []
    for line in (DATA / "responses_math_cot_100" / "math_cot_100.jsonl").read_text().splitlines():
        responses.extend(json.loads(line)["response"])
    out = []
    for i in range(rows):
        p = len(prompts[i * 37].as_py()[0]["content"].encode())
        r = len(responses[(i * 53) % len(responses)].encode())
        out.append((max(8, p // 4), max(1, r // 4)))
    return out


def embedded_lengths(rows: int) -> list[tuple[int, int]]:
    from dapo_rl.data import reasoning_gym_samples

    samples = reasoning_gym_samples("chain_sum", rows, 1, {"min_terms": 2, "max_terms": 3})
    return [(len(s.prompt[-1]["content"].encode()) + 8, 1 + (i * 7) % 24) for i, s in enumerate(samples)]


def make_batch(lengths: list[tuple[int, int]], pad: int) -> TrainBatch:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(0, 250, (r,), generator=g).tolist() for _, r in lengths]
    adv = torch.randn(len(lengths), generator=g)
    return TrainBatch.build(prompts, responses, adv, torch.ones(len(lengths)), pad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--micro", type=int, default=8, help="rows per micro-batch of the padded baseline")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--budget",
        type=int,
        default=0,
        help="token budget (default: twice the longest sequence)",
    )
    ap.add_argument("--spreads", default="dapo,embedded")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tok = save_tiny_checkpoint(tmp, hidden_size=256, intermediate_size=1024, num_layers=4, num_kv_heads=2)
        spreads = {"dapo": dapo_lengths, "embedded": embedded_lengths}
        for spread in args.spreads.split(","):
            lengths = spreads[spread](args.rows)
            batch = make_batch(lengths, tok.pad_token_id)
            real = int(batch.attention_mask.sum())
            biggest = args.budget or 2 * max(p + r for p, r in lengths)
            ways = {
                "padded": {"ppo_micro_batch_size": args.micro},
                "budget": {
                    "use_dynamic_bsz": True,
                    "ppo_max_token_len_per_gpu": biggest,
                    "use_remove_padding": False,
                },
                "budget+packed": {
                    "use_dynamic_bsz": True,
                    "ppo_max_token_len_per_gpu": biggest,
                    "use_remove_padding": True,
                },
            }
            times: dict[str, list[float]] = {w: [] for w in ways}
            losses: dict[str, float] = {}
            padded_tokens: dict[str, int] = {}
            for _ in range(args.repeats):
                for way, extra in ways.items():
                    actor = Actor(tmp, ActorConfig(lr=1e-6, **extra), AlgorithmConfig())
                    bins = actor.micro_batches(batch, torch.arange(len(batch)), biggest)
                    lens = batch.attention_mask.sum(1)
                    padded_tokens[way] = sum(
                        int(lens[i].sum()) if actor.remove_padding else len(i) * int(lens[i].max())
                        for i, _ in bins
                    )
                    t0 = time.perf_counter()
                    out = actor.update(batch)
                    times[way].append(time.perf_counter() - t0)
                    losses[way] = out["actor/pg_loss"]
            print(
                f"\n[{spread}] {args.rows} sequences, {real} real tokens (prompt+response lengths "
                f"{min(p + r for p, r in lengths)}-{max(p + r for p, r in lengths)}), budget {biggest} tokens"
            )
            print(
                f"{'way':<16}{'update s':>10}{'tokens/s':>11}{'forward tokens':>16}{'vs padded':>11}{'pg_loss diff':>14}"
            )
            base = statistics.median(times["padded"])
            for way in ways:
                med = statistics.median(times[way])
                print(
                    f"{way:<16}{med:>10.2f}{real / med:>11.0f}{padded_tokens[way]:>16}{base / med:>10.2f}x"
                    f"{abs(losses[way] - losses['padded']):>14.2e}"
                )


if __name__ == "__main__":
    main()
