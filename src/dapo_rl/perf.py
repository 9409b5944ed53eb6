"""Throughput accounting: the machine's matmul peak, measured, and model FLOPs utilisation (MFU).

MFU here is the training arithmetic a step needed divided by what the measured peak could have done in the time
the update took: 6N FLOPs per trained token (forward + backward, Kaplan et al. 2020) plus 2N per token of the
pi_old recompute forward, N the parameter count, over `time/update_s + time/old_log_prob_s`, against the peak
of one large matmul in the compute dtype on this device (measured, not a datasheet figure: a CPU without native
bf16 reaches a small fraction of its fp32 rate in bf16).
"""

from __future__ import annotations

import time

import torch

__all__ = ["matmul_peak_flops", "training_mfu"]


def matmul_peak_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int = 0
) -> float:
    """FLOP/s of the best of several `size` x `size` matmuls on `device` in `dtype` (one process, its threads).

    Args:
        device: where to measure.
        dtype: compute dtype (`torch.float32`, `torch.bfloat16`).
        size: matrix side; 0 picks 1024 on CPU and 8192 on GPU.

    Returns:
        FLOP/s (2 size^3 per matmul), a float.
    """
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.mm(a, b)
    sync()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * size**3 / best


def training_mfu(
    n_params: int, trained_tokens: float, recomputed_tokens: float, seconds: float, peak_flops: float
) -> float:
    """Model FLOPs utilisation of a policy update (see the module docstring).

    Args:
        n_params: parameters of the model (N).
        trained_tokens: prompt + response tokens through forward and backward, all ranks.
        recomputed_tokens: tokens through the no-grad pi_old forward (0 when it was skipped), all ranks.
        seconds: wall time of the update (and the recompute).
        peak_flops: FLOP/s of all ranks together (`matmul_peak_flops` x world size).

    Returns:
        A fraction in [0, 1] on a sane measurement (NaN when `seconds` or `peak_flops` is 0).
    """
    if seconds <= 0 or peak_flops <= 0:
        return float("nan")
    return (6.0 * n_params * trained_tokens + 2.0 * n_params * recomputed_tokens) / seconds / peak_flops
