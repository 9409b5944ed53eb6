"""How far the rollout engine's log-probs sit from the LoRA actor's at bfloat16: the merged push (W + delta rounded to
bf16, `actor.lora.merge=true`) against the adapter push (`actor.lora.merge=false`: the engine applies the adapters
unmerged), for adapters of a given size (review async-lora M2).

On the embedded tiny model (random weights, seed 3) in bfloat16 with LoRA r 8, alpha 16 on all linear layers, every
`lora_B` is drawn from N(0, sigma), sigma set so that the mean over layers of ||delta||_F / ||W||_F is `--ratio`
(delta = alpha / r B A). Each engine samples `--prompts` x `--n` responses of `--tokens` tokens at temperature 1
(seeded), and the actor (PEFT forward in bf16) recomputes the log-probs of those same tokens. Printed per engine and
push: the mean |engine - actor| log-prob gap (nats per token), the mean |base - actor| on the same tokens (the
adapters' own effect; the base model's log-probs), and the share of the weights' delta a bf16 merge keeps.

    python benchmarks/lora_bf16_gap.py                       # ratios 5e-4 and 5e-3, hf and vllm engines
    python benchmarks/lora_bf16_gap.py --engines hf --ratios 5e-4
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig, LoraConfig, RolloutConfig
from dapo_rl.lora import lora_layers
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer
from dapo_rl.rollout import SamplingParams, build_engine, with_lora

LORA = LoraConfig(rank=8, alpha=16.0)


def set_adapters(actor: Actor, ratio: float, seed: int = 0) -> float:
    """Draw every `lora_B` from N(0, sigma) with sigma such that mean ||delta|| / ||W|| over layers is `ratio`;
    returns the share of delta's entries (all layers) that W + delta rounded to bf16 leaves at W."""
    g = torch.Generator().manual_seed(seed)
    layers = lora_layers(actor.model)
    with torch.no_grad():
        for layer in layers.values():
            b = layer.lora_B["default"].weight
            b.copy_(torch.randn(b.shape, generator=g))
        rel = sum(
            float(layer.get_delta_weight("default").norm() / layer.base_layer.weight.float().norm())
            for layer in layers.values()
        ) / len(layers)
        lost = total = 0
        for layer in layers.values():
            layer.lora_B["default"].weight.mul_(ratio / rel)
            w = layer.base_layer.weight
            d = layer.get_delta_weight("default").float()
            merged = (w.float() + d).to(torch.bfloat16)
            lost += int(((merged == w) & (d != 0)).sum())
            total += d.numel()
    return lost / total


def recompute(actor: Actor, prompts, groups) -> tuple[torch.Tensor, torch.Tensor]:
    """(engine log-probs, actor log-probs) of the engine's sampled tokens, flattened."""
    tok = build_tiny_tokenizer()
    flat = [o for g in groups for o in g]
    batch = TrainBatch.build(
        [p for p, g in zip(prompts, groups) for _ in g],
        [o.token_ids for o in flat],
        torch.zeros(len(flat)),
        torch.ones(len(flat)),
        tok.pad_token_id,
    )
    rec = actor.compute_log_prob(batch)
    got = torch.cat([torch.tensor(o.logprobs) for o in flat])
    want = torch.cat([rec[i, : len(o.logprobs)] for i, o in enumerate(flat)])
    return got, want


@torch.no_grad()
def teacher_forced(model, prompts, groups) -> torch.Tensor:
    """Log-probs of the sampled tokens under `model` (temperature 1), one unpadded sequence per forward: the same
    kernels for the engine's model and the actor's, so the gap is the weights' alone."""
    out = []
    for p, g in zip(prompts, groups):
        for o in g:
            ids = torch.tensor([p + o.token_ids])
            logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
            out.append(
                torch.log_softmax(logits, -1).gather(-1, torch.tensor(o.token_ids)[:, None]).squeeze(-1)
            )
    return torch.cat(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ratios", type=float, nargs="+", default=[5e-4, 5e-3])
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = build_tiny_tokenizer()
    model_dir = tempfile.mkdtemp(prefix="lora-gap-")
    build_tiny_model(seed=3).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    prompts = [tok(f"{i} + {3 * i} - {i % 5} =\n")["input_ids"] for i in range(args.prompts)]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.tokens, seed=11)
    cfg = ActorConfig(ppo_micro_batch_size=16, lora=LORA)
    base = Actor(model_dir, ActorConfig(ppo_micro_batch_size=16), AlgorithmConfig(), dtype="bfloat16")
    rows = []
    for name in args.engines:
        kw = dict(max_model_len=256, dtype="bfloat16", seed=0)
        ro = RolloutConfig(name=name, micro_batch_size=64, kv_cache_gib=1.0)
        engines = {
            "merged (today)": build_engine(ro, model_dir, tok, **kw),
            "adapters": build_engine(with_lora(ro, LORA), model_dir, tok, **kw),
        }
        for ratio in args.ratios:
            actor = Actor(model_dir, cfg, AlgorithmConfig(), dtype="bfloat16", seed=1)
            kept_at_w = set_adapters(actor, ratio)
            for push, engine in engines.items():
                payload = (
                    actor.engine_adapters() if push == "adapters" else actor.engine_weights(torch.bfloat16)
                )
                engine.update_weights(payload)
                groups = engine.generate(prompts, params)
                got, want = recompute(actor, prompts, groups)
                _, base_lp = recompute(base, prompts, groups)
                tf = float("nan")
                if name == "hf":  # the engine's own model against the actor's, same forward, same tokens
                    tf = float(
                        (
                            teacher_forced(engine.model, prompts, groups)
                            - teacher_forced(actor.model, prompts, groups)
                        )
                        .abs()
                        .mean()
                    )
                rows.append(
                    (
                        name,
                        ratio,
                        push,
                        float((got - want).abs().mean()),
                        float((base_lp - want).abs().mean()),
                        tf,
                        kept_at_w,
                        got.numel(),
                    )
                )
                print(rows[-1], flush=True)
        for engine in engines.values():
            close = getattr(engine, "close", None)
            if close is not None:
                close()
    print()
    print(
        "| engine | \\|dW\\|/\\|W\\| | push | mean \\|engine - actor\\| (sampling log-probs) "
        "| the same, engine model teacher-forced | mean \\|base - actor\\| | delta entries a bf16 merge drops "
        "| tokens |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, ratio, push, gap, eff, tf, lost, ntok in rows:
        tfs = "n/a" if tf != tf else f"{tf:.2e}"
        print(f"| {name} | {ratio:g} | {push} | {gap:.2e} | {tfs} | {eff:.2e} | {100 * lost:.0f}% | {ntok} |")


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main()
