"""Process group, device and the few collectives the loop needs (SPMD: every rank runs the same loop).

A launcher (torchrun, or Ray Train's `TorchTrainer`) starts N processes and sets `RANK`, `WORLD_SIZE`,
`LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT`; `init_distributed` reads them, as nanoGPT does with one check of
`RANK`. Without them the run is one process and every collective here is the identity, so single-process code
pays nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from dapo_rl.config import ConfigError


@dataclass
class DistContext:
    """Where this process stands in the job.

    Attributes:
        rank: global rank in [0, world_size).
        world_size: number of processes (1: no process group).
        local_rank: rank on this machine (selects `cuda:<local_rank>`).
        device: the device model, batches and log-prob math live on.
        mesh: the 1-D data-parallel `DeviceMesh` FSDP2 shards over, or None in one process.
        cpu_group: a gloo process group over all ranks for object collectives and barriers (pickles travel
            through host memory, not through GPU buffers next to vLLM's); None: the default group.
        checkpoint_group: a gloo group whose timeout (`CHECKPOINT_TIMEOUT_S`) outlasts rank 0's Hugging Face
            export, for `barrier(ctx, checkpoint=True)`, and rank 0 waiting for its rollout producer in asynchronous
            training (the `slow` object collectives); None: `cpu_group`.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    mesh: Any = None
    cpu_group: Any = None
    checkpoint_group: Any = None

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes metrics, logs, plots and the checkpoint index."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """Several processes: collectives do something."""
        return self.world_size > 1

    @property
    def sharded(self) -> bool:
        """The model is FSDP2-sharded over `mesh`: any run with a mesh, including a 1-rank process group (the GPU
        check runs FSDP2 on one GPU that way)."""
        return self.mesh is not None


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The device of `trainer.device`: `auto` (CUDA when available, else CPU), `cpu` or `cuda`.

    Args:
        name: `auto`, `cpu` or `cuda`.
        local_rank: the rank on this machine; CUDA ranks take `cuda:<local_rank>`.

    Raises:
        ConfigError: `cuda` asked for where torch sees no CUDA device, or an unknown name.
    """
    if name not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"trainer.device={name!r} is not one of auto, cpu, cuda")
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise ConfigError(
            f"trainer.device=cuda, but torch sees no CUDA device ({build}); use trainer.device=cpu or auto, or "
            "install a CUDA build of torch on a machine with a GPU"
        )
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"local rank {local_rank} needs cuda:{local_rank}, but this machine has {torch.cuda.device_count()} "
            "CUDA device(s); launch at most that many processes per node"
        )
    return torch.device("cuda", local_rank)


def launched_world_size() -> int:
    """`WORLD_SIZE` set by a launcher (1 when absent)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """`RANK` set by a launcher (0 when absent): readable before `init_distributed`, and inside a signal handler."""
    return int(os.environ.get("RANK", "0"))


CHECKPOINT_TIMEOUT_S = 4 * 3600.0
"""Timeout of `DistContext.checkpoint_group`: a barrier there waits for rank 0 writing a checkpoint's Hugging Face
export (61 GB of bf16 for a 32B model) while the other ranks hold no GPU collective open; and, in asynchronous training,
rank 0 waiting for its rollout producer's batch or its engines' validation while the other ranks wait for it."""


def init_distributed(device: str = "auto", timeout_s: float = 1800.0) -> DistContext:
    """Join the job the launcher started (or stay one process) and pick this rank's device.

    Initialises the default process group (NCCL on CUDA, gloo on CPU) unless the launcher already did (Ray Train
    does), and builds the 1-D device mesh FSDP2 shards over.

    Args:
        device: `trainer.device`.
        timeout_s: how long a collective may wait for the other ranks (a dead rank is reported by the launcher).

    Raises:
        ConfigError: see `resolve_device`.
    """
    world = dist.get_world_size() if dist.is_initialized() else launched_world_size()
    if world <= 1:
        return DistContext(device=resolve_device(device))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if dev.type == "cuda" else "gloo",
            timeout=timedelta(seconds=timeout_s),
            device_id=dev if dev.type == "cuda" else None,
        )
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(dev.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    cpu_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    slow = dist.new_group(backend="gloo", timeout=timedelta(seconds=max(timeout_s, CHECKPOINT_TIMEOUT_S)))
    return DistContext(dist.get_rank(), dist.get_world_size(), local_rank, dev, mesh, cpu_group, slow)


def shutdown(ctx: DistContext) -> None:
    """Leave the process group (no-op in one process)."""
    if ctx.distributed and dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ collectives
def all_reduce(values: list[float], ctx: DistContext, op: str = "sum") -> list[float]:
    """Element-wise `sum` or `max` of a list of numbers over all ranks (float64; identity in one process).

    Args:
        values: the same length on every rank.
        ctx: this rank.
        op: `sum` or `max`.
    """
    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device(ctx))
    dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return t.tolist()


def all_gather_objects(obj: Any, ctx: DistContext, slow: bool = False) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, through `ctx.cpu_group` (`slow`: `ctx.checkpoint_group`, for
    ranks that may wait longer than the default timeout for rank 0); `[obj]` in one process."""
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=_object_group(ctx, slow))
    return out


def broadcast_object(obj: Any, ctx: DistContext, slow: bool = False) -> Any:
    """Rank 0's `obj` (picklable) on every rank, through `ctx.cpu_group` (`slow`: `ctx.checkpoint_group`, whose
    timeout outlasts rank 0 waiting for its rollout producer in asynchronous training); other ranks pass anything,
    e.g. None. `obj` in one process."""
    if not ctx.distributed:
        return obj
    box = [obj if ctx.rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=_object_group(ctx, slow))
    return box[0]


def _object_group(ctx: DistContext, slow: bool):
    return (ctx.checkpoint_group or ctx.cpu_group) if slow else ctx.cpu_group


def all_to_all_objects(objs: list[Any], ctx: DistContext) -> list[Any]:
    """Send `objs[r]` (picklable) to rank r and receive what every rank sent to this one, in rank order (an object
    all-to-all: each rank gets only its own share, unlike `all_gather_objects`). Through `ctx.cpu_group`; in one
    process `[objs[0]]`.

    Args:
        objs: `world_size` objects, one per destination rank.

    Raises:
        ValueError: `len(objs) != world_size`.
    """
    import pickle

    if len(objs) != ctx.world_size:
        raise ValueError(f"all_to_all_objects needs {ctx.world_size} objects (one per rank), got {len(objs)}")
    if not ctx.distributed:
        return [objs[0]]
    dev = torch.device("cpu") if ctx.cpu_group is not None else _comm_device(ctx)
    payloads = [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objs]
    sizes = torch.tensor([len(p) for p in payloads], dtype=torch.int64, device=dev)
    incoming = torch.empty_like(sizes)
    dist.all_to_all_single(incoming, sizes, group=ctx.cpu_group)
    data = b"".join(payloads)
    send = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
        if data
        else torch.empty(0, dtype=torch.uint8, device=dev)
    )
    split_in = incoming.tolist()
    recv = torch.empty(sum(split_in), dtype=torch.uint8, device=dev)
    dist.all_to_all_single(
        recv, send, output_split_sizes=split_in, input_split_sizes=sizes.tolist(), group=ctx.cpu_group
    )
    out, start = [], 0
    raw = recv.cpu().numpy().tobytes()
    for n in split_in:
        out.append(pickle.loads(raw[start : start + n]))
        start += n
    return out


def barrier(ctx: DistContext, checkpoint: bool = False) -> None:
    """Wait for every rank, on `ctx.cpu_group` (`checkpoint`: on `ctx.checkpoint_group`, whose timeout outlasts
    rank 0 writing a checkpoint's export); no-op in one process."""
    if ctx.distributed:
        dist.barrier(group=(ctx.checkpoint_group or ctx.cpu_group) if checkpoint else ctx.cpu_group)


def _comm_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.device.type == "cuda" else torch.device("cpu")
