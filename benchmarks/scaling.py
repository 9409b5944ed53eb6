"""How the step time grows with the work, and how peak memory follows the token budget.

1. Step time as the group size `rollout.n`, the batch (`data.train_batch_size` prompts) and the response length
   (`data.max_response_length`) each double three times from a base of 8 prompts x 4 samples x 32 tokens. Work grows
   linearly in each, so should the time: the script prints the median step time (steps 2-4 of `dapo train`, one
   subprocess per point) and `time per unit of work / that at the smallest point` (1.00 = exactly linear; the
   acceptance is within 20%; below 1 a per-step constant is being amortised), and a least-squares fit
   `fixed + slope x work` with the largest deviation from it (linear cost plus a per-step constant fits closely). The model is Qwen2-shaped (hidden 256, 4 layers, random init, byte vocabulary),
   which rarely samples its end-of-sequence token, so responses run to the length limit; no dynamic sampling and
   no shaping, one optimizer step per batch.
2. Peak resident memory of one `Actor.update` over 64 sequences of 200-1000 tokens with `actor.use_dynamic_bsz` as
   `ppo_max_token_len_per_gpu` doubles (one fresh process per budget; the increase of ru_maxrss over the process
   after loading the model), against fixed micro-batches of 64 rows.

    python benchmarks/scaling.py [--steps 4] [--skip-memory]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def build_model(path: Path) -> None:
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(path, hidden_size=256, intermediate_size=1024, num_layers=4, num_kv_heads=2)


def step_time(model: Path, out: Path, prompts: int, n: int, length: int, steps: int) -> float:
    overrides = [
        f"model.path={model}",
        f"trainer.output_dir={out}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.progress_bar=false",
        f"data.train_batch_size={prompts}",
        f"data.gen_batch_size={prompts}",
        f"data.max_response_length={length}",
        f"rollout.n={n}",
        "rollout.name=hf",
        "algorithm.filter_groups.enable=false",
        "algorithm.overlong_buffer.enable=false",
        f"actor.ppo_mini_batch_size={prompts}",
        "actor.ppo_micro_batch_size=64",
        "actor.autocast_dtype=none",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "dapo_rl.cli", "train", *overrides], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"dapo train exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["time/step_s"] for r in rows if "time/step_s" in r and r["step"] > 1)


def affine_fit(work: list[float], seconds: list[float]) -> tuple[float, float, float]:
    """Least-squares `seconds = fixed + slope * work`; returns `(fixed, slope, largest |relative residual|)`. A cost
    that grows linearly with the work plus a per-step constant fits within a few percent; a superlinear one shows
    as a large deviation (and as a per-unit time that rises with the work)."""
    n = len(work)
    mw, ms = sum(work) / n, sum(seconds) / n
    slope = sum((w - mw) * (t - ms) for w, t in zip(work, seconds)) / sum((w - mw) ** 2 for w in work)
    fixed = ms - slope * mw
    worst = max(abs(t - (fixed + slope * w)) / t for w, t in zip(work, seconds))
    return fixed, slope, worst


def peak_rss_child(model: str, budget: int) -> None:
    """In a fresh process: one update; prints the ru_maxrss increase in MiB."""
    import torch

    from dapo_rl.actor import Actor, TrainBatch
    from dapo_rl.config import ActorConfig, AlgorithmConfig

    g = torch.Generator().manual_seed(0)
    lengths = [200 + (i * 131) % 800 for i in range(64)]
    prompts = [torch.randint(0, 250, (50,), generator=g).tolist() for _ in lengths]
    responses = [torch.randint(0, 250, (n - 50,), generator=g).tolist() for n in lengths]
    batch = TrainBatch.build(prompts, responses, torch.randn(64, generator=g), torch.ones(64), 257)
    cfg = (
        ActorConfig(ppo_micro_batch_size=64)
        if budget == 0
        else ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget)
    )
    actor = Actor(model, cfg, AlgorithmConfig())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    actor.update(batch)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mib": (after - before) / 1024}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--rss-child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_child:
        peak_rss_child(args.rss_child[0], int(args.rss_child[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        build_model(model)
        base = {"prompts": 8, "n": 4, "length": 32}
        print("step time as one dimension doubles (the others at 8 prompts x 4 samples x 32 tokens)")
        print(f"{'dimension':<12}{'value':>7}{'s/step':>9}{'s per unit of work vs the smallest':>36}")
        for dim in ("n", "prompts", "length"):
            first = None
            times = []
            for k in range(4):
                point = dict(base, **{dim: base[dim] * 2**k})
                out = Path(tmp) / f"{dim}_{k}"
                t = step_time(model, out, point["prompts"], point["n"], point["length"], args.steps)
                times.append(t)
                per_unit = t / 2**k
                first = first or per_unit
                print(f"{dim:<12}{point[dim]:>7}{t:>9.2f}{per_unit / first:>36.2f}")
            fixed, slope, worst = affine_fit([2**k for k in range(4)], times)
            print(
                f"{'':<12}fit: {fixed:.2f} s per step + {slope:.2f} s per unit of work, "
                f"largest deviation from the fit {worst:.0%}"
            )
        if args.skip_memory:
            return
        print("\npeak memory of one update, 64 sequences of 200-1000 tokens")
        print(f"{'micro-batches':<36}{'peak MiB':>10}")
        for budget in (0, 1024, 2048, 4096, 8192):
            proc = subprocess.run(
                [sys.executable, __file__, "--rss-child", str(model), str(budget)],
                capture_output=True,
                text=True,
                env=dict(os.environ),
            )
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            mib = json.loads(proc.stdout.strip().splitlines()[-1])["peak_mib"]
            label = "64 rows each (padded)" if budget == 0 else f"use_dynamic_bsz, {budget} tokens"
            print(f"{label:<36}{mib:>10.0f}")


if __name__ == "__main__":
    main()
