"""The actor update with LoRA adapters against full fine-tuning, side by side in one run: the same batch through
`Actor.update` of a full actor and of a LoRA actor (the recipe's `actor.lora`), alternating `--rounds` times, plus
the merged-weight push each would make (`engine_weights`, consumed without an engine).

Prints the median seconds of each phase per round and the LoRA / full ratios. A time holds only with its machine:
compare the ratios, not the seconds.

    python benchmarks/lora_update.py                                   # SmolLM2-135M, smollm2_chain_sum_lora's update
    python benchmarks/lora_update.py --recipe tiny_chain_sum --rank 8  # the embedded tiny model
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import LoraConfig, load_config


def batch(cfg, vocab: int, prompt_len: int, response_len: int, seed: int = 0) -> TrainBatch:
    """`data.train_batch_size` groups of `rollout.n` sequences (random ids, responses of 1/2 to 3/2 x
    `response_len` tokens), in the recipe's mini-batches, advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    groups, n = cfg.data.train_batch_size, cfg.rollout.n
    prompts, responses, adv, mb = [], [], [], []
    for k in range(groups):
        p = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        for j in range(n):
            length = int(torch.randint(response_len // 2, response_len * 3 // 2 + 1, (1,), generator=g))
            prompts.append(p)
            responses.append(torch.randint(0, vocab, (length,), generator=g).tolist())
            adv.append(1.0 if j % 2 else -1.0)
            mb.append(k // cfg.actor.ppo_mini_batch_size)
    return TrainBatch.build(prompts, responses, torch.tensor(adv), torch.ones(len(prompts)), 0, minibatch=mb)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--recipe", default="smollm2_chain_sum", help="recipe of the full actor (default smollm2_chain_sum)"
    )
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha 2 x rank, all-linear)")
    ap.add_argument("--lora-lr", type=float, default=1e-4)
    ap.add_argument(
        "--prompt-len", type=int, default=60, help="prompt tokens (the SmolLM2 recipe's: about 60)"
    )
    ap.add_argument("--response-len", type=int, default=14, help="mean response tokens (its runs: 12-14)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = load_config(args.recipe)
    path = cfg.model.path
    if path == "embedded":
        from dapo_rl.sft import ensure_embedded_model

        path = str(ensure_embedded_model(cfg.sft))
    else:
        from dapo_rl.models.smollm2 import MODEL_ALIASES, resolve_model_alias

        if path in MODEL_ALIASES:
            path = resolve_model_alias(path, print)
    lora_cfg = replace(cfg.actor, lr=args.lora_lr, lora=LoraConfig(rank=args.rank, alpha=2.0 * args.rank))
    actors = {
        "full": Actor(path, cfg.actor, cfg.algorithm, temperature=cfg.rollout.temperature),
        "lora": Actor(path, lora_cfg, cfg.algorithm, temperature=cfg.rollout.temperature),
    }
    vocab = actors["full"].model.config.vocab_size
    data = batch(cfg, vocab, args.prompt_len, args.response_len)
    trained = {k: sum(p.numel() for p in a.trainable) for k, a in actors.items()}
    print(f"{len(data)} sequences, {int(data.attention_mask.sum())} tokens; trainable {trained}", flush=True)
    times: dict[str, dict[str, list[float]]] = {k: {"update": [], "push": []} for k in actors}
    for r in range(args.rounds):
        for name in ("full", "lora") if r % 2 == 0 else ("lora", "full"):
            a = actors[name]
            b = batch(cfg, vocab, args.prompt_len, args.response_len)
            t0 = time.perf_counter()
            a.update(b)
            t1 = time.perf_counter()
            for _ in a.engine_weights():
                pass
            t2 = time.perf_counter()
            times[name]["update"].append(t1 - t0)
            times[name]["push"].append(t2 - t1)
            print(f"round {r}: {name:4s}  update {t1 - t0:6.2f} s  push {t2 - t1:5.2f} s", flush=True)
    for phase in ("update", "push"):
        full, lora = (statistics.median(times[k][phase]) for k in ("full", "lora"))
        print(
            f"{phase}: full {full:.2f} s, LoRA {lora:.2f} s (median of {args.rounds}); LoRA / full = {lora / full:.2f}"
        )


if __name__ == "__main__":
    main()
