"""Running the loop on many processes: process group and device, FSDP2 wrapping, cross-rank counts and balancing,
launchers (torchrun, Ray Train). See DESIGN.md, "Scaling out"."""

from dapo_rl.distributed.balance import balanced_partition, shard_minibatches
from dapo_rl.distributed.env import (
    DistContext,
    all_gather_objects,
    all_reduce,
    all_to_all_objects,
    barrier,
    broadcast_object,
    init_distributed,
    launched_rank,
    launched_world_size,
    resolve_device,
    shutdown,
)

__all__ = [
    "DistContext",
    "all_gather_objects",
    "all_reduce",
    "all_to_all_objects",
    "balanced_partition",
    "barrier",
    "broadcast_object",
    "init_distributed",
    "launched_rank",
    "launched_world_size",
    "resolve_device",
    "shard_minibatches",
    "shutdown",
]
