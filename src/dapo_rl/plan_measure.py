"""`dapo plan --measure`: the per-GPU memory of a recipe's actor update, measured by running it on fake tensors.

`measure_update(cfg, hf_config, world_size=W)` builds the recipe's model from its config.json shape without weights
(`Actor(config=...)`), at the recipe's world size, and runs the real `Actor.update` over one mini-batch
(`measure_setup`) at the recipe's maximum lengths under torch's `FakeTensorMode` (tensors carry shapes, dtypes and
devices but no data: nothing is computed and nothing is allocated), with the fake process group (`FakeStore`, backend
`"fake"`: every collective returns at once) and `FSDPMemTracker` (one process: `MemTracker`) counting every tensor
on this rank's device, by kind, at every op. This is torchtitan's memory estimation (`scripts/estimate/estimation.py`)
applied to this actor; `tracked_update` is the same measurement of an update on real tensors, which the tests
compare it with (2 gloo ranks on the CPU).

What the measurement follows, as a training step does:

- AdamW's moments exist from the second step on, so they are created first by one zero-gradient
  `optimizer.step()`, outside the tracked update (torchtitan runs an untracked first iteration for the same reason).
  Only parameters that require gradients get that zero gradient: under LoRA (`actor.lora.rank` > 0) the frozen
  base has none, and the optimizer (the adapters only) would not clear one.
- Every micro-batch after the first of a mini-batch runs with the gradients of the ones before it resident: the
  update covers two micro-batches where a rank's share of a mini-batch holds two, and the peak is the larger.
- The batch carries old and rollout log-probs (as a vLLM rollout does), so the no-grad recompute of the old
  log-probs (a smaller peak) is not part of it.
- Every prompt is distinct, so `actor.shared_prefix` takes the ordinary forward; every row is at the maximum lengths
  (`data.max_prompt_length` + `data.max_response_length`, no padding).

The fake device: a CPU-only torch cannot put FSDP2 on fake `cuda` (`fully_shard` asks `torch.cuda.current_device()`),
so there the fake device is `cpu` and the model's code takes its CPU paths: SDPA's CPU kernels (no seq x seq score
matrix, as flash or memory-efficient attention on a GPU), and no flash-attention, hence the padded forward
(`model.attn_implementation=auto` and `flash_attention_*` are measured as `sdpa`). Host-side bookkeeping of the
update (the batch's ids, masks and counts, which live on the CPU in a GPU run too) runs for real beside the fake
tensors and is not counted (`_HostStaysReal`); values the update reads back from fake tensors (`.item()`, `bool()`)
read 1.

Not measured: the CUDA context, NCCL's buffers and the caching allocator's fragmentation (a few GiB on a GPU).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dapo_rl.config import Config

MEASURED_MICRO_BATCHES = 2
"""Micro-batches in the measured mini-batch (where the rank's share holds two): the second runs with the first's
gradients resident."""

_TORCH_DIR = os.path.dirname(torch.__file__)
_PASS_THROUGH = tuple(
    os.path.join(_TORCH_DIR, *parts)
    for parts in (
        ("_dynamo", "eval_frame.py"),
        ("_compile.py",),
        ("_tensor.py",),
        ("utils", "_python_dispatch.py"),
    )
)
"""torch's own frames between a Python caller and a dispatch mode (`Tensor.__rsub__` and the like included)."""
_DTENSOR_META = os.path.join(_TORCH_DIR, "distributed", "tensor", "_op_schema.py")
"""Where DTensor builds global-shape stand-ins of an op's arguments to propagate shardings (`gen_fake_args`)."""
_DAPO_DIR = os.path.dirname(os.path.abspath(__file__))


def _caller() -> str:
    """The file of the code that called the op being dispatched (torch's pass-through frames skipped)."""
    f = sys._getframe(2)
    while f is not None and (
        f.f_code.co_filename.startswith(_PASS_THROUGH) or f.f_code.co_filename == __file__
    ):
        f = f.f_back
    return "" if f is None else f.f_code.co_filename


class _HostStaysReal(TorchDispatchMode):
    """Entered inside `FakeTensorMode` and the tracker (it sees each op first): keeps the update's host-side
    bookkeeping real and out of the tracker's count.

    - An op on plain (real) tensors only runs for real, outside every mode: the batch's ids, masks and counts, which
      `Actor.update` keeps on the CPU and reads back (`int(attention_mask.sum(1).max())`).
    - A factory op (no tensor argument) runs for real when dapo_rl's own code calls it (`torch.arange(t)` of the
      response positions in `Actor.forward`); when torch or transformers calls it (the model's `arange`s, FSDP2's
      all-gather buffers) it goes on to the tracker and the fake mode.
    - `.item()` / `bool()` of a fake tensor returns 1 / True (the loss for the metrics, `isfinite(grad_norm)`).
    - DTensor's sharding propagation (global-shape stand-ins of a DTensor op's arguments, and the op run on them to
      read the output's shape) runs in a fake mode of its own, out of the tracker's sight: it allocates nothing in a
      real run, and under the one global fake mode the tracker would count a full-size copy of every gradient in
      `clip_grad_norm_`.
    - Anything else (ops on fake tensors) goes on to the tracker and the fake mode; tensor subclasses (DTensor) are
      sent back to unwrap themselves first.
    """

    def __init__(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        super().__init__()
        self._shadow = FakeTensorMode(allow_non_fake_inputs=True)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._python_dispatch import _disable_current_modes
        from torch.utils._pytree import tree_leaves

        kwargs = kwargs or {}
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        if any(
            not isinstance(t, FakeTensor) and type(t) not in (torch.Tensor, torch.nn.Parameter)
            for t in tensors
        ):
            return NotImplemented
        if any(isinstance(t, FakeTensor) and t.fake_mode is self._shadow for t in tensors) or (
            not tensors and _caller() == _DTENSOR_META
        ):
            with _disable_current_modes(), self._shadow:
                return func(*args, **kwargs)
        fake = any(isinstance(t, FakeTensor) for t in tensors)
        if fake and func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            x = args[0]
            if func is torch.ops.aten.is_nonzero.default or x.dtype == torch.bool:
                return True
            return 1.0 if x.dtype.is_floating_point else 1
        if not fake and (tensors or _caller().startswith(_DAPO_DIR)):
            with _disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def micro_batch_rows(cfg: Config, world_size: int) -> int:
    """Rows of one training micro-batch at the maximum lengths: `actor.ppo_micro_batch_size`, or with
    `actor.use_dynamic_bsz` as many full-length rows as `actor.ppo_max_token_len_per_gpu` tokens hold; never more
    than the rank's share of a mini-batch (`ppo_mini_batch_size x rollout.n / world_size`), never fewer than 1."""
    a, d = cfg.actor, cfg.data
    if a.use_dynamic_bsz:
        rows = a.ppo_max_token_len_per_gpu // (d.max_prompt_length + d.max_response_length)
    else:
        rows = a.ppo_micro_batch_size
    return max(1, min(rows, _mini_batch_share(cfg, world_size)))


def _mini_batch_share(cfg: Config, world_size: int) -> int:
    return max(1, math.ceil(cfg.actor.ppo_mini_batch_size * cfg.rollout.n / world_size))


def measure_setup(cfg: Config, world_size: int, vocab_size: int):
    """The actor settings and the batch of a measured update.

    The batch is one mini-batch of `micro_batches` micro-batches of `rows` (`micro_batch_rows`) sequences:
    `data.max_prompt_length` prompt tokens and `data.max_response_length` response tokens each (no padding), every
    prompt distinct, advantages of both signs, old and rollout log-probs given (0). `micro_batches` is 2 where the
    rank's share of a mini-batch holds two micro-batches (the second runs with the first's gradients resident),
    else 1. The settings are `actor.*` with `ppo_micro_batch_size = rows` (so that the update cuts exactly those
    micro-batches) and `autocast_dtype=auto` taken as bf16 (its choice on a GPU).

    Args:
        cfg: the recipe.
        world_size: ranks the mini-batch is shared by.
        vocab_size: the model's vocabulary (token ids are drawn below it).

    Returns:
        `(actor_config, batch, rows, micro_batches)`.
    """
    from dapo_rl.actor import TrainBatch

    d = cfg.data
    rows = micro_batch_rows(cfg, world_size)
    micro_batches = MEASURED_MICRO_BATCHES if _mini_batch_share(cfg, world_size) >= 2 * rows else 1
    b = rows * micro_batches
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, vocab_size, (b, d.max_prompt_length), generator=g)
    prompts[:, 0] = (
        torch.arange(b) % vocab_size
    )  # distinct prompts: the ordinary forward, not the shared prefix
    responses = torch.randint(0, vocab_size, (b, d.max_response_length), generator=g)
    advantages = torch.tensor([(-1.0) ** i for i in range(b)])
    zeros = [[0.0] * d.max_response_length] * b
    batch = TrainBatch.build(
        prompts.tolist(), responses.tolist(), advantages, torch.ones(b), pad_id=0, rollout_logprobs=zeros
    )
    batch.old_log_prob = torch.zeros_like(batch.response_mask)
    autocast = "bfloat16" if cfg.actor.autocast_dtype == "auto" else cfg.actor.autocast_dtype
    actor_config = replace(cfg.actor, ppo_micro_batch_size=rows, autocast_dtype=autocast)
    return actor_config, batch, rows, micro_batches


MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "temporaries")
"""How a measurement is split (bytes each, plus `total`)."""

_TRACKER_KINDS = {
    "params": ("Sharded Param", "Unsharded Param", "All Gather", "Parameter", "Buffer"),
    "grads": ("Sharded Grad", "Unsharded Grad", "Reduce Scatter", "Gradient"),
    "optimizer": ("OptState", "Optstate"),
    "activations": ("Activation", "Inputs", "Other"),
    "temporaries": ("Temp",),
}
"""`MEMORY_KINDS` -> the tracker's categories (`FSDPMemTracker`'s and `MemTracker`'s names)."""


def _split(snapshot: dict) -> dict[str, Any]:
    by_name = {str(getattr(k, "value", k)): int(v) for k, v in snapshot.items()}
    out: dict[str, Any] = {k: sum(by_name.get(n, 0) for n in names) for k, names in _TRACKER_KINDS.items()}
    out["total"] = by_name.get("Total", 0)
    out["tracker"] = {n: v for n, v in by_name.items() if n != "Total" and v}
    return out


def _one_process_tracker():
    """torch's `MemTracker`, except that parameters which require no gradient (LoRA's frozen base) get no gradient
    hook: `MemTracker` registers one on every parameter of a module at its first forward, and `Tensor.register_hook`
    refuses a tensor that does not require gradients ("cannot register a hook on a tensor that doesn't require
    gradient"). The hooks are installed by torch's own code on a stand-in module holding the trainable parameters;
    the module itself is then counted without hooks. Full fine-tuning takes torch's path unchanged."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class _Tracker(MemTracker):
        def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
            params = list(module.parameters())
            if not install_grad_hooks or all(p.requires_grad for p in params):
                return super()._track_module_params_and_buffers(module, install_grad_hooks)
            trainable = torch.nn.Module()
            for i, p in enumerate(q for q in params if q.requires_grad):
                trainable.register_parameter(f"p{i}", p)
            super()._track_module_params_and_buffers(trainable, install_grad_hooks=True)
            return super()._track_module_params_and_buffers(module, install_grad_hooks=False)

    return _Tracker()


def tracked_update(actor, batch, *, fake: bool = False) -> dict[str, dict[str, Any]]:
    """One `actor.update(batch)` under a memory tracker, after creating AdamW's moments with a zero-gradient step.

    Args:
        actor: an `Actor`; FSDP2-sharded (`actor.ctx.sharded`: `FSDPMemTracker`) or not (`MemTracker`, taught
            frozen parameters: `_one_process_tracker`).
        batch: its `TrainBatch` (`measure_setup`).
        fake: the actor lives under `FakeTensorMode` (the caller's): keep host-side work real (`_HostStaysReal`).

    Returns:
        `{"update_peak": ..., "resident": ...}` for the actor's device: the update's peak, and what stays after it
        (parameters and AdamW state); each maps `MEMORY_KINDS` and `total` to bytes, and `tracker` to the tracker's
        own categories (bytes, the non-zero ones).
    """
    # LoRA's frozen base gets no gradient (the zero_grad below clears the optimizer's parameters only)
    for p in actor.model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    actor.optimizer.step()
    actor.optimizer.zero_grad(set_to_none=True)
    if actor.ctx.sharded:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        tracker = FSDPMemTracker(actor.model, actor.optimizer)
    else:
        tracker = _one_process_tracker()
        tracker.track_external(actor.model, actor.optimizer)
    from torch.nn.modules.module import register_module_forward_pre_hook

    def reset(module, args):
        if module is actor.model:
            tracker.reset_mod_stats()

    with ExitStack() as stack:
        # The trackers refuse a second forward of the root module unless their per-module statistics are cleared
        # (the global peak is kept). A global hook registered before the tracker's own runs before all of them.
        stack.callback(register_module_forward_pre_hook(reset).remove)
        stack.enter_context(tracker)
        if fake:
            stack.enter_context(_HostStaysReal())
        actor.update(batch)
    dev = actor.device
    return {
        "update_peak": _split(tracker.get_tracker_snapshot("peak").get(dev, {})),
        "resident": _split(tracker.get_tracker_snapshot("current").get(dev, {})),
    }


def measure_update(
    cfg: Config, hf_config, *, world_size: int, attn_implementation: str = "sdpa"
) -> dict[str, Any]:
    """The recipe's actor update on fake tensors at `world_size` ranks (this process is rank 0 of a fake process
    group), measured with `tracked_update`.

    Args:
        cfg: the recipe (its `actor`, `algorithm`, `data` lengths, `model.dtype`, `rollout.n` and temperature).
        hf_config: the model's transformers config (`dapo_rl.plan.model_config`); its `vocab_size` draws the ids.
        world_size: ranks the model is sharded over; 1: one process, no FSDP2 (bf16 compute, if asked, through
            autocast).
        attn_implementation: transformers' attention kernel.

    Returns:
        `tracked_update`'s `update_peak` and `resident`, plus `rows` and `micro_batches` (`measure_setup`),
        `tokens_per_micro_batch`, `largest_param_bytes` (the largest full parameter in `model.dtype`: what rank 0
        broadcasts at once while loading), `world_size`, `device` (`"fake cpu"`), `compute_dtype`, `seconds` (wall
        time of the whole measurement).

    Raises:
        RuntimeError: this process already belongs to a process group.
        ConfigError: `algorithm.use_kl_loss` (the measurement does not model the reference policy yet).
    """
    if cfg.algorithm.use_kl_loss:
        from dapo_rl.config import ConfigError

        raise ConfigError(
            "dapo plan --measure does not model the KL term's reference policy yet (algorithm.use_kl_loss=true): "
            "measure without it and add one more copy of the weights, sharded like the actor's, and no optimizer "
            "state; its forward needs no more than the actor's"
        )
    t0 = time.perf_counter()
    # Others' garbage is freed now, and no collection runs inside the fake mode: a finalizer run there sees fake
    # tensors (vLLM's CPU GEMM handler raised DataDependentOutputException in its __del__ under it).
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _measure_update(cfg, hf_config, world_size, attn_implementation, t0)
    finally:
        if collecting:
            gc.enable()


def _measure_update(cfg: Config, hf_config, world_size: int, attn_implementation: str, t0: float) -> dict:
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dapo_rl.actor import Actor
    from dapo_rl.distributed import DistContext

    dev = torch.device("cpu")
    actor_config, batch, rows, micro_batches = measure_setup(cfg, world_size, hf_config.vocab_size)
    algo = cfg.algorithm
    if algo.loss_scale_factor is None:  # as the trainer sets it: Dr. GRPO's constant, the generation budget
        algo = replace(algo, loss_scale_factor=float(cfg.data.max_response_length))
    ctx = DistContext(device=dev)
    if world_size > 1:
        if dist.is_initialized():
            raise RuntimeError(
                "dapo plan --measure runs its own fake process group; this process already has one"
            )
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        if world_size > 1:  # outside FakeTensorMode, as torchtitan builds its mesh
            mesh = init_device_mesh(dev.type, (world_size,), mesh_dim_names=("dp",))
            ctx = DistContext(0, world_size, 0, dev, mesh)
        with FakeTensorMode(allow_non_fake_inputs=True):
            actor = Actor(
                "(no weights: dapo plan --measure)",
                actor_config,
                algo,
                ctx,
                dtype=cfg.model.dtype,
                temperature=cfg.rollout.temperature,
                attn_implementation=attn_implementation,
                config=hf_config,
            )
            # the largest full parameter (a DTensor's numel is its full size)
            largest = max(p.numel() * p.element_size() for p in actor.model.parameters())
            result = tracked_update(actor, batch, fake=True)
    finally:
        if world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
    return {
        **result,
        "rows": rows,
        "micro_batches": micro_batches,
        "tokens_per_micro_batch": rows * (cfg.data.max_prompt_length + cfg.data.max_response_length),
        "largest_param_bytes": largest,
        "world_size": world_size,
        "device": f"fake {dev.type}",
        "compute_dtype": cfg.model.dtype
        if actor_config.autocast_dtype == "none"
        else actor_config.autocast_dtype,
        "seconds": time.perf_counter() - t0,
    }
