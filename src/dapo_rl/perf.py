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

__all__ = ["BF16_MIN_SPEEDUP", "choose_autocast_dtype", "matmul_peak_flops", "training_mfu"]

BF16_MIN_SPEEDUP = 1.3
"""`actor.autocast_dtype=auto` picks bf16 only when a bf16 matmul runs at least this much faster than fp32."""


def matmul_peak_flops(
    device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int = 0
) -> float:
    """FLOP/s of the best of several `size` x `size` matmuls on `device` in `dtype` (one process, its threads); one
    matmul only when the first takes over half a second.

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

    t0 = time.perf_counter()
    torch.mm(a, b)
    sync()
    best = time.perf_counter() - t0
    if best > 0.5:  # a dtype without native support (bf16 on an AVX2 CPU): one slow matmul says enough
        return 2.0 * size**3 / best
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


def choose_autocast_dtype(setting: str, device: torch.device | str, measure=None) -> tuple[str, str]:
    """Resolve `actor.autocast_dtype` (`none`, `bfloat16` or `auto`) for this device, measuring rather than guessing.

    `auto` means bf16 only where it is faster: one fp32 and one bf16 matmul are timed on `device` (256 x 256 on a
    CPU, where a bf16 matmul without native support runs at ~0.3 GFLOP/s and a larger probe would take seconds),
    and bf16 is chosen when it runs at least :data:`BF16_MIN_SPEEDUP` x faster -- GPUs, and CPUs with native bf16
    (AVX512-BF16, AMX); elsewhere fp32 is kept. `none` and `bfloat16` are kept as they are, without measuring.

    Args:
        setting: the configured value.
        device: the actor's device.
        measure: ``measure(device, dtype) -> FLOP/s``; default :func:`matmul_peak_flops` at the probe size.

    Returns:
        ``(dtype, reason)``: ``"bfloat16"`` or ``"none"``, and a sentence for the log.
    """
    if setting in ("none", "bfloat16"):
        return setting, f"actor.autocast_dtype={setting}"
    device = torch.device(device)
    size = 256 if device.type == "cpu" else 0
    measure = measure or (lambda d, t: matmul_peak_flops(d, t, size=size))
    fp32, bf16 = measure(device, torch.float32), measure(device, torch.bfloat16)
    figures = f"bf16 matmul {bf16 / 1e9:.1f} GFLOP/s, fp32 {fp32 / 1e9:.1f} GFLOP/s on this {device.type}"
    if bf16 >= BF16_MIN_SPEEDUP * fp32:
        return "bfloat16", f"bf16 compute chosen by actor.autocast_dtype=auto: {figures}"
    return "none", f"fp32 compute chosen by actor.autocast_dtype=auto: no native bf16 here ({figures})"
