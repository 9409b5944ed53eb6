"""FSDP2 (`torch.distributed.fsdp.fully_shard`) wrapping of a transformers causal LM."""

from __future__ import annotations

import torch


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's repeated blocks: modules whose class is in transformers' `_no_split_modules` (e.g.
    `Qwen2DecoderLayer`, `LlamaDecoderLayer`), the unit FSDP shards and all-gathers one at a time."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model, mesh, compute_dtype: torch.dtype | None = None, lm_head_fp32: bool = False) -> None:
    """Shard `model` in place over the 1-D data-parallel `mesh`: each decoder layer, then the root (embeddings,
    final norm, head; tied weights stay one parameter in the root group).

    Args:
        model: a transformers causal LM on the mesh's device.
        mesh: `DeviceMesh` of the data-parallel ranks.
        compute_dtype: `torch.bfloat16` for bf16 forward/backward with parameters, gradients reduced and optimizer
            state kept in the parameters' dtype (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`);
            None computes in the parameters' dtype.
        lm_head_fp32: the head was made float32 (`dapo_rl.models.lm_head.lm_head_in_fp32`, `actor.lm_head_fp32`):
            under bf16 compute or a bf16 body an untied head becomes its own group, gathered and reduced in float32
            (a group all-gathers one dtype); a tied head stays in the root group (its forward upcasts the gathered
            copy); an all-float32 run needs nothing.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        if compute_dtype is not None
        else MixedPrecisionPolicy()
    )
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    if lm_head_fp32:
        from dapo_rl.models.lm_head import head_is_tied

        head = model.get_output_embeddings()
        # a group of its own only where the root would gather it in another dtype: bf16 compute, or a bf16 body
        if not head_is_tied(model) and (
            compute_dtype not in (None, torch.float32)
            or {p.dtype for p in model.parameters()} != {torch.float32}
        ):
            fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
            # resharded after its forward (a non-root group's default, as verl shards every group): gathered again
            # for the backward, so no-grad forwards (pi_old, the KL reference) leave no float32 copy behind
            fully_shard(head, mesh=mesh, mp_policy=fp32)
    fully_shard(model, mesh=mesh, mp_policy=mp)
