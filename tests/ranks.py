"""Helpers for the tests that run several real gloo ranks on this CPU (`torch.multiprocessing` spawn)."""

import os
import socket

import torch


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_gloo(rank: int, world: int, port: int):
    """Set the variables a launcher would (`MASTER_ADDR/PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`), one torch thread,
    and join the job through `dapo_rl.distributed.init_distributed("cpu")`; returns its `DistContext`."""
    from dapo_rl.distributed import init_distributed

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    return init_distributed("cpu")
