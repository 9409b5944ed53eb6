"""Launchers: never our own. `dapo train trainer.nproc_per_node=N` re-runs the same command under torch's elastic
launcher (what `torchrun --standalone` does); `trainer.launcher=ray` runs the same SPMD function in Ray Train's
`TorchTrainer` workers. Inside each process `dapo_rl.trainer.run` joins the process group the launcher set up."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dapo_rl.config import Config, ConfigError

EXIT_RANK_FAILED = 1
"""Exit code when a rank died without an exit code of its own (a crash with a traceback)."""


SHUTDOWN_TIMEOUT_S = 1800
"""Seconds `dapo train trainer.nproc_per_node=N`'s launcher waits for its ranks after forwarding a SIGTERM or a Ctrl-C
before it kills them (torch's default, 30 s, is shorter than a GPU step and its checkpoint), unless
`TORCH_ELASTIC_SHUTDOWN_TIMEOUT` says otherwise."""


def _rank_failure_message(rank: int, exitcode: int) -> str:
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"rank {rank} was killed by {name}"
    return f"rank {rank} exited with code {exitcode}"


def launch_torchrun(argv: list[str], nproc_per_node: int) -> int:
    """Run `python -m dapo_rl.cli <argv>` as `nproc_per_node` ranks on this machine through torch's elastic launcher
    (the engine behind `torchrun --standalone`; no restarts), and return the job's exit code.

    Each rank reads `RANK`/`WORLD_SIZE` and joins the group (`dapo_rl.distributed.init_distributed`); rank 0 prints
    the run's lines. When a rank dies, the launcher stops the others and this says which rank and how. SIGTERM to
    this process is forwarded to the ranks, which save a checkpoint after the step in progress and exit
    (`dapo_rl.trainer.run`), and so is a Ctrl-C (the ranks run in a session of their own: a terminal's Ctrl-C
    reaches this process alone); a second Ctrl-C reaches them as SIGTERM, which they take as the second press and
    quit at once (`dapo_rl.stopping`). The launcher waits `TORCH_ELASTIC_SHUTDOWN_TIMEOUT` seconds (default here
    `SHUTDOWN_TIMEOUT_S`, 30 min, not torch's 30 s: a step and its checkpoint must fit) before it kills them.

    Returns:
        0; the ranks' common exit code (2, 3, 4, 143 after SIGTERM, or 130 after Ctrl-C); 128 + the signal number for a rank killed by
        a signal, or for this process stopped by one; or the first failed rank's code.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # as torchrun does: the ranks share the machine's cores instead of each taking all of them
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc_per_node,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        shutdown_timeout=int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_TIMEOUT_S)),
    )
    try:
        elastic_launch(config, entrypoint=sys.executable)("-m", "dapo_rl.cli", *argv)
    except (
        SignalException
    ) as e:  # the launcher forwarded it to the ranks and waited for them: rank 0 said why
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        failures = sorted(e.failures.items(), key=lambda kv: kv[1].timestamp)
        rank, first = failures[0]
        if first.exitcode in (2, 3, 4, 128 + signal.SIGTERM, 128 + signal.SIGINT):
            # a configuration error, exhausted sampling, divergence, or a SIGTERM or Ctrl-C the ranks got directly
            # (Slurm and a terminal signal every process) and stopped on: the rank said why
            return first.exitcode
        # the launcher stops the surviving ranks with SIGTERM (they exit at once, or with 143 when they were past
        # set-up): report only the ranks that failed by themselves
        stopped = (-signal.SIGTERM, 128 + signal.SIGTERM)
        own = [(r, f) for r, f in failures if (r, f) == (rank, first) or f.exitcode not in stopped]
        what = "; ".join(_rank_failure_message(r, f.exitcode) for r, f in own)
        print(
            f"dapo train: {what}; the launcher stopped the other ranks. The run directory keeps its last complete "
            "checkpoint: run the same command with --resume to continue from it.",
            file=sys.stderr,
        )
        if first.exitcode < 0:
            return 128 - first.exitcode
        return first.exitcode or EXIT_RANK_FAILED
    return 0


def _absolute(cfg: Config) -> Config:
    """The config with its local paths made absolute (Ray workers may run in another directory)."""

    def absolute(p: str) -> str:
        return str(Path(p).expanduser().resolve()) if p else p

    model = cfg.model if cfg.model.path == "embedded" else replace(cfg.model, path=absolute(cfg.model.path))
    data = replace(
        cfg.data,
        train_files=[absolute(f) for f in cfg.data.train_files],
        val_files=[absolute(f) for f in cfg.data.val_files],
    )
    trainer = replace(cfg.trainer, output_dir=absolute(cfg.trainer.output_dir))
    sft = replace(cfg.sft, output_dir=absolute(cfg.sft.output_dir))
    return replace(cfg, model=model, data=data, trainer=trainer, sft=sft)


def _ray_worker(config: dict) -> None:
    """The function every Ray Train worker runs: the same `dapo train` as under torchrun (`config["run"]`, which
    `launch_ray`'s caller hands in: the launcher knows nothing of the training loop)."""
    import ray.train
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the workers' output reaches the driver's log, not a terminal
    os.environ.setdefault("DAPO_RL_CACHE", config["cache"])
    code = config["run"](config["cfg"], resume=config["resume"])
    ray.train.report({"exit_code": code})


def ray_use_gpu(device: str, cluster_gpus: float, workers: int) -> bool:
    """Whether the Ray Train workers take a GPU each, from `trainer.device` and the GPUs the Ray cluster has, not
    from the driver's own torch: with `ray job submit` or a CPU-only head node the driver sees no GPU while the
    workers do.

    Args:
        device: `trainer.device` (`auto`, `cpu`, `cuda`).
        cluster_gpus: `ray.cluster_resources()["GPU"]` (0 when absent).
        workers: Ray Train workers the job starts (`nnodes x n_gpus_per_node`).

    Raises:
        ConfigError: `cuda`, or `auto` on a cluster with some GPUs, where the cluster has fewer GPUs than workers
            (Ray would wait forever, or mix GPU and CPU workers).
    """
    if device == "cpu" or (device == "auto" and cluster_gpus == 0):
        return False
    if cluster_gpus < workers:
        raise ConfigError(
            f"trainer.device={device} with {workers} Ray Train worker(s) (trainer.nnodes x trainer.n_gpus_per_node), "
            f"but the Ray cluster has {cluster_gpus:g} GPU(s) now; start Ray on the GPU nodes (ray start --address "
            "...), lower the worker count, or on an autoscaling cluster bring the GPU nodes up first"
        )
    return True


def launch_ray(cfg: Config, run: Callable[..., int], resume: bool = False) -> int:
    """Run `dapo train` on a Ray cluster through Ray Train's `TorchTrainer`: `trainer.nnodes x
    trainer.n_gpus_per_node` workers, one GPU each (one CPU each with `trainer.device=cpu`), each running the same
    SPMD loop (`run`: `dapo_rl.trainer.run`, handed in by the CLI) in the process group Ray Train sets up (gloo on
    CPU, NCCL on GPU).

    Joins a running cluster (`ray.init(address="auto")`, e.g. started with `ray start --head`); without one it
    starts a local cluster with enough CPUs for the workers.

    Returns:
        The workers' exit code (0, 2, 3, 4), or 1 when a worker failed without one (the message says which).

    Raises:
        ConfigError: `ray[train]` is not installed.
    """
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer
    except ImportError as e:
        raise ConfigError(
            "trainer.launcher=ray: Ray Train is not installed; pip install 'dapo-rl[ray]' (or 'ray[train]'), or use "
            "the torchrun launcher (trainer.launcher=torchrun trainer.nproc_per_node=N)"
        ) from e
    from dapo_rl.paths import cache_root

    t = cfg.trainer
    workers = t.nnodes * t.n_gpus_per_node
    if not ray.is_initialized():
        try:
            ray.init(address="auto", log_to_driver=True)
        except ConnectionError:  # no running cluster: start a local one
            try:
                ray.init(num_cpus=max(os.cpu_count() or 1, workers), log_to_driver=True)
            except Exception as e:
                raise ConfigError(
                    f"trainer.launcher=ray: no running Ray cluster, and a local one did not start "
                    f"({type(e).__name__}: {' '.join(str(e).split())[:300]})"
                ) from e
    gpu = ray_use_gpu(t.device, float(ray.cluster_resources().get("GPU", 0)), workers)
    cfg = _absolute(cfg)
    run_dir = Path(cfg.trainer.output_dir)
    trainer = TorchTrainer(
        _ray_worker,
        train_loop_config={"cfg": cfg, "run": run, "resume": resume, "cache": str(cache_root().resolve())},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers, use_gpu=gpu, resources_per_worker=None if gpu else {"CPU": 1}
        ),
        run_config=RunConfig(
            name=f"dapo-{run_dir.name}",
            storage_path=str(run_dir / "ray_results"),
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    try:
        result = trainer.fit()
    except Exception as e:  # Ray Train's TrainingFailedError and friends: a worker died or raised
        print(
            f"dapo train: a Ray Train worker failed ({type(e).__name__}: {' '.join(str(e).split())[:500]}). The run "
            "directory keeps its last complete checkpoint: run the same command with --resume to continue.",
            file=sys.stderr,
        )
        return EXIT_RANK_FAILED
    return int((result.metrics or {}).get("exit_code", 0))
