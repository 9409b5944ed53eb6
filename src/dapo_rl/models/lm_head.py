"""The LM head in float32 (`actor.lm_head_fp32`): ScaleRL's fix for the training/sampling log-prob mismatch.

ScaleRL (Khatri et al. 2025, "The Art of Scaling Reinforcement Learning Compute for LLMs", arXiv 2510.13786,
Sec. 3.2 "FP32 precision at the LM head") finds that computing the final projection in float32 narrows the gap between
the trainer's and the sampler's token probabilities and lifts the asymptotic reward; TRL's `cast_lm_head_to_fp32`
does the same. Under bf16 compute the head's matmul rounds each logit to 8 mantissa bits; the softmax over a large
vocabulary amplifies that rounding into the log-probabilities the policy ratio is made of.

Here the head's forward runs outside `torch.autocast` on float32 inputs and float32 weights:
- an untied head keeps its parameters in float32 (under FSDP2 it is its own `fully_shard` group with a float32
  `MixedPrecisionPolicy`, `dapo_rl.distributed.fsdp.shard_model`);
- a tied head (shared with the input embedding, as the tiny model's and SmolLM2's) keeps the embedding's storage and
  multiplies its (under FSDP2: bf16 all-gathered) copy in float32.
The rest of the model computes as `actor.autocast_dtype` says. The `hf` rollout engine takes the same head; vLLM
computes its own in float32 through its `head_dtype` override (`dapo_rl.rollout.vllm`).
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from dapo_rl.config import ConfigError

__all__ = ["lm_head_in_fp32", "is_fp32_head", "head_is_tied", "fp32_head_names", "lm_head_fp32_note"]


def _fp32_forward(self: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """`(..., hidden)` any float dtype -> `(..., vocab)` float32 logits, autocast off."""
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        bias = None if self.bias is None else self.bias.float()
        return F.linear(hidden.float(), self.weight.float(), bias)


def head_is_tied(model: torch.nn.Module) -> bool:
    """Whether `model`'s output embedding shares its weight with the input embedding (transformers'
    `tie_word_embeddings`)."""
    inp, out = model.get_input_embeddings(), model.get_output_embeddings()
    return out is not None and inp is not None and out.weight is inp.weight


def is_fp32_head(module: torch.nn.Module | None) -> bool:
    """Whether `lm_head_in_fp32` changed this head module's forward."""
    fwd = getattr(module, "forward", None)
    return getattr(fwd, "__func__", None) is _fp32_forward


def fp32_head_names(model: torch.nn.Module) -> set[str]:
    """State-dict names of an untied float32 head's parameters (`lm_head.weight`, its bias), which a bf16 push keeps
    in float32; empty for a tied head or one `lm_head_in_fp32` did not change."""
    head = model.get_output_embeddings()
    if not is_fp32_head(head) or head_is_tied(model):
        return set()
    own = {id(p) for p in head.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in own}


def lm_head_in_fp32(model: torch.nn.Module) -> torch.nn.Module:
    """Make `model`'s LM head compute in float32 (see the module docstring), in place, before any sharding.

    The head's `forward` is replaced on the instance (a bound method: `copy.deepcopy`, e.g. the KL term's reference,
    rebinds it to the copy; FSDP2's hooks run around it). An untied head's parameters become float32 (new
    `Parameter`s, so call this before an optimizer holds them; nothing changes when `model.dtype` is float32).

    Costs: the logits are float32 (twice bf16's memory); on GPUs the head's matmuls run at float32 speed, not on
    bf16 tensor cores (unmeasured here); a tied head casts the shared `(V, hidden)` weight to float32 at each forward
    where that weight is bf16 (under FSDP2's bf16 gather, or in a bf16 engine), a copy the backward keeps.

    Args:
        model: a transformers causal LM (`get_output_embeddings()` an `nn.Linear`), on any device (`meta` and
            `FakeTensorMode` included: `dapo plan --measure`).

    Returns:
        The head module.

    Raises:
        ConfigError: the model has no output embedding with a weight, or the head carries a LoRA adapter (PEFT's
            `lora_A`): the adapter's matmul would bypass the float32 forward.
    """
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ConfigError(f"actor.lm_head_fp32: {type(model).__name__} has no linear LM head")
    if hasattr(head, "lora_A") or hasattr(head, "base_layer"):
        raise ConfigError(
            "actor.lm_head_fp32 with a LoRA adapter on the LM head: the adapter's matmul would bypass the float32 "
            "head; leave lm_head out of actor.lora.target_modules"
        )
    if not head_is_tied(model):
        # new parameters, not `Module.float()`: its parameter swap fails on fake tensors
        for name, p in list(head.named_parameters(recurse=False)):
            if p.dtype != torch.float32:
                setattr(head, name, torch.nn.Parameter(p.detach().float(), requires_grad=p.requires_grad))
    head.forward = types.MethodType(_fp32_forward, head)
    return head


def lm_head_fp32_note(autocast_dtype: str, model_dtype: str, engine: str) -> str:
    """The line the trainer logs at start when `actor.lm_head_fp32` is on: what it does in this run, or a warning
    that it does nothing (every weight and the compute already float32).

    Args:
        autocast_dtype: `actor.autocast_dtype` as resolved (`none` / `bfloat16`).
        model_dtype: `model.dtype`.
        engine: `rollout.name`.
    """
    if autocast_dtype != "bfloat16" and model_dtype == "float32":
        return (
            "warning: actor.lm_head_fp32=true changes nothing here: the run computes in float32 "
            "(actor.autocast_dtype=none, model.dtype=float32); it matters under actor.autocast_dtype=bfloat16"
        )
    how = "vLLM's head_dtype=float32" if engine == "vllm" else "the same float32 head"
    return (
        "actor: LM head in float32 (actor.lm_head_fp32) in the actor, its KL reference if any, and the "
        f"{engine} engine ({how})"
    )
