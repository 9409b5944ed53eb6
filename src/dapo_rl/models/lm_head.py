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
The rest of the model computes as `actor.autocast_dtype` says.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from dapo_rl.config import ConfigError

__all__ = ["lm_head_in_fp32", "is_fp32_head", "head_is_tied", "fp32_head_names"]


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
    rebinds it to the copy; FSDP2's hooks run around it). An untied head's parameters become float32 (`.float()`;
    a no-op when `model.dtype` is float32).

    Args:
        model: a transformers causal LM (`get_output_embeddings()` an `nn.Linear`), on any device, `meta` included.

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
        head.float()
    head.forward = types.MethodType(_fp32_forward, head)
    return head
